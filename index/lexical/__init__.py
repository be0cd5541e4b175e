"""The lexical leg on Tantivy on disk: the read-only engine, its files, statistics and one writer.

Every gateway process maps the same index folders read-only (``engine.TantivyLexical``, a
``LexicalEngine``); ``mnemo lexical follow`` runs the one writer (``writer.LexicalWriter``) that
builds them from the store and follows its change feed.

Modules and their public names:
- ``engine``: ``TantivyLexical``, ``TantivyConfig``, ``MODES``.
- ``files``: the index's folders, schema, documents and watermark (``create_index``, ``document``).
- ``stats``: BM25 statistics read from an index (``IndexStats``).
- ``writer``: ``LexicalWriter``, ``PartitionWriter``, ``WriterConfig``.
- ``metrics``: ``LexicalMetrics`` on the gateway's registry.
"""
