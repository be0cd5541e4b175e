"""A model as the sidecar's API sees it: the :class:`Backend` protocol and its in-process adapter.

The Ray Serve ingress passes :class:`~inference.serve_app.HandleBackend` (a deployment handle);
in-process servers and tests pass :class:`LocalBackend` around a ``ModelService``.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Backend", "LocalBackend"]


class Backend(Protocol):
    """One model as the API sees it: a local :class:`~inference.service.ModelService` or a Serve handle."""

    async def embed(self, texts: list[str], *, truncate: bool, return_sparse: bool) -> dict[str, Any]: ...
    async def embed_texts(self, texts: list[str], *, truncate: bool) -> dict[str, Any]: ...
    async def embed_images(self, images: list[bytes]) -> dict[str, Any]: ...
    async def rerank(
        self, query: str, documents: list[str], *, truncate: bool, raw_scores: bool
    ) -> dict[str, Any]: ...
    async def tokenize(self, texts: list[str]) -> list[int]: ...
    async def info(self) -> dict[str, Any]: ...
    async def is_ready(self) -> bool: ...
    async def stats(self) -> dict[str, Any]: ...
    def coalescing(self) -> dict[str, int] | None:
        """Calls and bundles sent to the model when the backend coalesces calls (else None)."""
        ...


class LocalBackend:
    """Adapts an in-process ``ModelService`` to :class:`Backend`."""

    def __init__(self, service: Any) -> None:
        self.service = service

    async def embed(self, texts, *, truncate, return_sparse):
        return await self.service.embed(texts, truncate=truncate, return_sparse=return_sparse)

    async def embed_texts(self, texts, *, truncate):
        return await self.service.embed_texts(texts, truncate=truncate)

    async def embed_images(self, images):
        return await self.service.embed_images(images)

    async def rerank(self, query, documents, *, truncate, raw_scores):
        return await self.service.rerank(query, documents, truncate=truncate, raw_scores=raw_scores)

    async def tokenize(self, texts):
        return await self.service.tokenize(texts)

    async def info(self):
        return self.service.info()

    async def is_ready(self):
        return self.service.is_ready()

    async def stats(self):
        return self.service.stats()

    def coalescing(self) -> None:  # in-process: every call is already a plain function call
        return None
