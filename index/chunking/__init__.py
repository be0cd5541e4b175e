"""Structure-aware semantic chunking of one resolved archive document.

Modules and their public names:
- ``chunker``: ``chunk``, ``Chunk``, ``detect_mode``, ``estimate_tokens``, ``CHUNKER_VERSION``.
- ``markers``: structural markers and the hard-bounded units they cut (``split_units``).
- ``packing``: ``Packer``, a unit packed into chunks between ``min_tokens`` and ``max_tokens``.
- ``sentences``: paragraph, sentence and word spans; ``semantic_breaks``: ``break_after``.
"""
