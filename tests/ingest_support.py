"""Helpers shared by the ingestion tests: descriptors, records, a counting client, row reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from index.settings import IngestSettings
from index.store.partitions import get_partition
from inference.client import EmbedResult, SidecarClient
from inference.net import free_port

TEXT_MODEL = "all-minilm-l6-v2"
SPARSE_MODEL = "tiny-bge-m3-random"

# Ample retries-free settings: tests drive time by editing next_attempt_at, never by sleeping.
SETTINGS = IngestSettings(batch_records=8, embed_batch=16, outage_pause=0.2, drain_interval=0.1)

ORAL_HISTORY = {
    "embed": [
        {"id": "summary", "contributors": ["oh23", "oh24"], "mode": "short"},
        {
            "id": "transcription",
            "contributors": ["rsc36"],
            "mode": "transcription",
            "chunk": {"max_tokens": 60, "min_tokens": 10},
        },
    ]
}

TRANSCRIPT = (
    "[TC_00:00:04.000_TC] Entrevistadora: ¿Qué recuerda del último verano en el pueblo?\n"
    "[TC_00:00:09.500_TC] Rosario: Trillábamos en la era como todos los años, aunque ya sabíamos "
    "que iban a cerrar las compuertas del pantano.\n"
    "[TC_00:01:02.000_TC] Rosario: Cuando llegó el agua tuvimos que marcharnos. Subía un palmo "
    "cada noche y cargamos el carro con los colchones.\n"
    "[TC_00:02:15.250_TC] Rosario: Lo que más me dolió fue el cementerio, trasladado a cajas.\n"
)


def record(section_id: int, **overrides: Any) -> dict[str, Any]:
    """An oral-history record in Spanish and English, with a timecoded transcription."""
    base: dict[str, Any] = {
        "section_tipo": "oh1",
        "section_id": section_id,
        "projects": [1, 2],
        "title": {"lg-spa": "Rosario Vidal: el pantano", "lg-eng": "Rosario Vidal: the reservoir"},
        "groups": {
            "summary": {
                "lg-spa": f"Rosario recuerda la llegada del agua del pantáno (registro {section_id}).",
                "lg-eng": f"Rosario remembers the reservoir water arriving (record {section_id}).",
            },
            "transcription": {"lg-spa": TRANSCRIPT},
        },
    }
    base.update(overrides)
    return base


class CountingClient(SidecarClient):
    """The real client, counting the texts it sends to ``/embed`` (per call and in total)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.embedded: list[str] = []

    async def embed(self, model: str, texts: Sequence[str], **kwargs: Any) -> EmbedResult:
        result = await super().embed(model, texts, **kwargs)
        self.embedded.extend(texts)
        return result


async def text_rows(pool: asyncpg.Pool, model: str = TEXT_MODEL, section_id: int | None = None) -> list[Any]:
    """Every text row of a model's partition, in key order."""
    partition = await get_partition(pool, model)
    if partition is None:
        return []
    return await pool.fetch(
        f"""SELECT section_tipo, section_id, component_tipo, lang, chunk_index, source_hash,
                   source_text, lexical_text, token_count, projects, chunk_meta, parent_key,
                   embedding, sparse, updated_at
            FROM {partition.table}
            WHERE modality = 'text' AND ($1::bigint IS NULL OR section_id = $1)
            ORDER BY section_tipo, section_id, component_tipo, lang, chunk_index""",
        section_id,
    )


async def queue_rows(pool: asyncpg.Pool) -> list[Any]:
    """The queue's rows; ``backoff``: how long after its last change a row's next attempt is (a
    failure sets both in one statement, so it is the backoff exactly, however slow the machine)."""
    return await pool.fetch(
        "SELECT section_tipo, section_id, operation, version, attempts, last_error, "
        "next_attempt_at - updated_at AS backoff FROM rag_index_queue ORDER BY section_tipo, section_id"
    )


async def make_ready(pool: asyncpg.Pool) -> None:
    """Skip the backoff clock: every queued row becomes ready now."""
    await pool.execute("UPDATE rag_index_queue SET next_attempt_at = now()")


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    return f"http://127.0.0.1:{free_port()}"
