"""Mnemo's indexing: the store, its read legs, the engines beside it (Tantivy, FAISS), chunking, ingestion, bulk jobs.

Subpackages, each naming its job in its own docstring: ``store``, ``search``, ``lexical``, ``vectors``,
``follow``, ``chunking``, ``ingest``, ``bulk``, ``cli``; top-level modules shared by all: ``settings``
(reaching the sidecar), ``media_urls``, ``models``, ``text``, ``lru``.
"""

from index.chunking.chunker import CHUNKER_VERSION, Chunk, chunk, detect_mode, estimate_tokens

__all__: list[str] = ["CHUNKER_VERSION", "Chunk", "chunk", "detect_mode", "estimate_tokens"]
