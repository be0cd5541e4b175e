"""PostgreSQL's binary COPY format, as the vector cache reads a partition's rows in bulk.

Binary COPY of the key columns and the pgvector ``vector`` is the cache's load path: one stream per
batch, no per-row protocol overhead, parsed here without building a Python object per value.
"""

from __future__ import annotations

import struct

import numpy as np

from index.store.change_feed import RowKey

__all__ = ["parse_copy"]


_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"


def parse_copy(data: bytes, dimension: int) -> tuple[list[RowKey], np.ndarray]:
    """Rows of a binary COPY of ``(section_tipo, section_id, component_tipo, lang, view, chunk_index,
    embedding)`` as keys and an (n, dimension) float32 array (pgvector's binary ``vector``:
    int16 dim, int16 unused, dim big-endian float4)."""
    if not data.startswith(_COPY_SIGNATURE):
        raise ValueError("not a binary COPY stream")
    (ext,) = struct.unpack_from(">i", data, 15)
    pos = 19 + ext
    keys: list[RowKey] = []
    offsets: list[int] = []
    unpack_i, unpack_h, unpack_q = (
        struct.Struct(">i").unpack_from,
        struct.Struct(">h").unpack_from,
        struct.Struct(">q").unpack_from,
    )
    while True:
        (nfields,) = unpack_h(data, pos)
        pos += 2
        if nfields == -1:
            break
        fields: list[tuple[int, int]] = []
        for _ in range(nfields):
            (length,) = unpack_i(data, pos)
            fields.append((pos + 4, length))
            pos += 4 + max(length, 0)
        (p0, l0), (p1, _), (p2, l2), (p3, l3), (p4, l4), (p5, _), (p6, _) = fields
        keys.append(
            (
                data[p0 : p0 + l0].decode(),
                unpack_q(data, p1)[0],
                data[p2 : p2 + l2].decode(),
                data[p3 : p3 + l3].decode(),
                data[p4 : p4 + l4].decode(),
                unpack_i(data, p5)[0],
            )
        )
        (dim,) = unpack_h(data, p6)
        if dim != dimension:
            raise ValueError(f"stored vector has {dim} dimensions, the partition {dimension}")
        offsets.append(p6 + 4)
    vectors = np.empty((len(offsets), dimension), dtype=np.float32)
    for i, off in enumerate(offsets):
        vectors[i] = np.frombuffer(data, dtype=">f4", count=dimension, offset=off)
    return keys, vectors
