"""Mnemo's gateway: the dd_rag_api service, auth and the ACL chokepoint, hybrid retrieval.

Names load on first use, so ``mnemo --help`` (which imports this package) stays instant.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ApiError": "gateway.errors",
    "GatewaySettings": "gateway.settings",
    "Principal": "gateway.auth",
    "Retriever": "gateway.retrieval",
    "create_app": "gateway.app",
    "load_gateway_settings": "gateway.settings",
    "rrf": "gateway.fusion",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
