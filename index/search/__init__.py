"""The read legs over the store: scope SQL, the dense, lexical and learned-sparse legs, BM25.

What a query runs against PostgreSQL, and the ``LexicalEngine`` protocol that an engine beside the
store (``index.lexical``) fills for the lexical leg.

Modules and their public names:
- ``scope_sql``: the one scope and ACL push-down ``WHERE`` builder (``scope_where``, ``WhereSql``).
- ``access_classes``: what the push-down reads of a chunk besides its key (``access_class``,
  ``permitted_classes``).
- ``dense_leg``: cosine distance over a partition (``dense_search``, ``reads_exactly``, ``seed_chunks``).
- ``lexical_leg``: BM25 over the folded tsvector and the sparse inner product (``lexical_search``,
  ``sparse_search``).
- ``bm25``: query parsing, corpus statistics and the per-query plan (``CorpusStats``, ``bm25_plan``).
- ``lexical_engine``: the ``LexicalEngine`` protocol; ``lexical_reread``: ``reread_candidates``.
- ``read_settings``: the session settings the legs run under; ``stopwords``: ``strip_stopwords``.
"""
