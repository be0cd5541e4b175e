"""Mnemo's inference sidecar: model wrappers, batching, the Ray Serve app, its HTTP contract, a client."""

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
