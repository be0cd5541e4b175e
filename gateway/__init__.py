"""Mnemo's gateway: the dd_rag_api service, auth and the ACL chokepoint, hybrid retrieval.

Names load on first use, so ``mnemo --help`` (which imports this package) stays instant.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ApiError": "gateway.base.errors",
    "GatewaySettings": "gateway.base.settings",
    "Principal": "gateway.access.auth",
    "Retriever": "gateway.retrieval.retriever",
    "create_app": "gateway.web.app",
    "load_gateway_settings": "gateway.base.settings",
    "rrf": "gateway.retrieval.fusion",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
