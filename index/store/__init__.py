"""The embeddings store: rows, per-model partitions, hits, the change feed, sections, image rows.

The one owner of what ``rag_embeddings`` and its companion tables hold. Every other part of
``index`` (the read legs, the engines beside the store, ingestion, bulk jobs) reads or writes
through here.

Modules and their public names:
- ``store``: the one writer and reader of chunk rows (``upsert_rows``, ``copy_rows``, ``read_rows``,
  ``stored_vectors``, ``delete_record``).
- ``partitions``: ``ModelPartition``, ``get_partition``, ``ensure_partition``, ``list_partitions``.
- ``hits``: the domain types the legs return (``ChunkHit``, ``Scope``, ``AclPushdown``).
- ``change_feed``: ``Watermark``, ``changes_since``, ``ChangeListener``, ``store_identity``.
- ``sections``: section descriptors (``SectionStore``, ``validate_descriptor``).
- ``image_rows``, ``image_store``: image rows, stored image vectors and thumbnails.
- ``neighbours``: a chunk's document window and parent section.
- ``pg_copy``: PostgreSQL's binary COPY format (``parse_copy``).
- ``validation``: JSON-schema errors that name the field (``FieldError``, ``first_error``).
- ``executor``: ``Executor``, what a statement runs on (a connection or a pool).
"""
