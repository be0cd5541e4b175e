"""Mnemo's indexing: the vector store, chunker, ingestion queue and drain, image jobs."""

from index.chunker import CHUNKER_VERSION, Chunk, chunk, detect_mode, estimate_tokens

__all__: list[str] = ["CHUNKER_VERSION", "Chunk", "chunk", "detect_mode", "estimate_tokens"]
