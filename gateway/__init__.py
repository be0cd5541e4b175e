"""Mnemo's gateway: the dd_rag_api service, auth and the ACL chokepoint, hybrid retrieval."""

__all__: list[str] = []
