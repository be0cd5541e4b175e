"""Mnemo's inference sidecar: model wrappers, batching, the Ray Serve app, its HTTP contract, a client.

The client's names load on first use (PEP 562), so ``import inference.batching`` or
``inference.encoders`` pulls in neither aiohttp nor anything else the client needs: the GPU
benchmark runs the batcher and model code on bare CUDA machines without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names type checkers and IDEs see
    from .client import (
        EmbedResult,
        ModelInfo,
        SidecarClient,
        SidecarError,
        SidecarOverloaded,
        SidecarRejected,
        SidecarUnavailable,
    )

__all__ = [
    "EmbedResult",
    "ModelInfo",
    "SidecarClient",
    "SidecarError",
    "SidecarOverloaded",
    "SidecarRejected",
    "SidecarUnavailable",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(".client", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
