"""Mnemo's inference sidecar: model wrappers, batching, the Ray Serve app, its HTTP contract, a client."""

__all__: list[str] = []
