"""Choosing which sidecar model to use for a role (text, image_text, rerank)."""

from __future__ import annotations

from inference.client import ModelInfo, SidecarClient


class ModelNotServed(LookupError):
    """The configured model is not served by the sidecar, or no model of the kind exists."""


async def resolve_model(client: SidecarClient, kind: str, configured: str | None) -> ModelInfo:
    """The configured model of ``kind``, or the first one the sidecar lists when unset.

    A configured id that the sidecar does not serve is an error, never a quiet
    substitute.
    """
    models = await client.models()
    of_kind = [m for m in models if m.kind == kind]
    if configured:
        for m in of_kind:
            if m.id == configured:
                return m
        served = ", ".join(m.id for m in of_kind) or "none"
        raise ModelNotServed(
            f"model {configured!r} ({kind}) is not served by the sidecar; {kind} models: {served}"
        )
    if not of_kind:
        raise ModelNotServed(f"the sidecar serves no {kind} model")
    return of_kind[0]
