"""Mnemo's indexing: the vector store, chunker, ingestion queue and drain, image jobs."""

__all__: list[str] = []
