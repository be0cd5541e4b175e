"""Settings for reaching the inference sidecar, shared by ingestion, the gateway and eval."""

from __future__ import annotations

from dataclasses import dataclass

from schema.settings import SettingsError, setting


@dataclass(frozen=True)
class SidecarClientSettings:
    sidecar_url: str = setting(
        "RAG_SIDECAR_URL",
        "http://127.0.0.1:8001",
        "Base URL of the inference sidecar (`mnemo sidecar`). Every component that embeds uses it.",
    )
    sidecar_api_key: str | None = setting(
        "RAG_SIDECAR_API_KEY",
        None,
        "Bearer key for the sidecar. When set on the sidecar, every route but health requires it.",
    )
    text_model: str | None = setting(
        "RAG_TEXT_MODEL",
        None,
        "Text model id for `/embed`. Unset: the first `text` model the sidecar lists.",
    )
    image_model: str | None = setting(
        "RAG_IMAGE_MODEL",
        None,
        "Joint image/text model id for `/image` and `/text`. Unset: the first `image_text` model listed.",
    )
    rerank_model: str | None = setting(
        "RAG_RERANK_MODEL",
        None,
        "Cross-encoder id for `/rerank`. Unset: the first `rerank` model listed (none: no reranking).",
    )
    sidecar_timeout: float = setting(
        "RAG_SIDECAR_TIMEOUT",
        30.0,
        "Seconds per sidecar request. Lower fails over sooner under load; higher waits out long batches.",
    )

    def validate(self) -> None:
        if self.sidecar_timeout <= 0:
            raise SettingsError("RAG_SIDECAR_TIMEOUT must be positive")
