"""Ingestion throughput: records/s and chunks/s end to end, and where the time goes (the ingest suite).

:func:`run_ingest_benchmark` queues a deterministic multilingual collection (oral-history
transcriptions with timecodes, catalogue cards, long documents with headings and pages) through the
real intake, drains it with the real sidecar into real PostgreSQL, and measures beside it, in the same
run, the same chunk texts sent straight to ``/embed``, the same rows written one ``INSERT`` per chunk
and one multi-row upsert per record (each also without the HNSW index, which bounds what batching can
gain), and the unchanged collection pushed again (which must embed nothing). benchmarks/README.md
says what each figure is.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

import asyncpg

from index.demo import demo_sections
from index.ingest.drain import drain_once
from index.ingest.intake import enqueue_records
from index.models import resolve_model
from index.settings import IngestSettings
from index.store import store
from index.store.partitions import ModelPartition, ensure_partition, get_partition
from index.store.sections import SectionStore
from inference.client import SidecarClient
from inference.contract import Route
from inference.routes import EMBED

from .report import SuiteResult, Table
from .tables import Column, HeadlineRow, headings, rows

__all__ = ["RecordingClient", "as_suite", "embed_alone", "make_records", "run_ingest_benchmark"]

_WORDS = {
    "lg-spa": (
        "cuando llegó el agua tuvimos que marcharnos del pueblo con los colchones y las gallinas "
        "el pantano cubrió la iglesia y el cementerio mi padre trabajaba en la era y mi madre cosía "
        "la fábrica cerró y las familias jóvenes se fueron a la ciudad a buscar trabajo en invierno"
    ).split(),
    "lg-eng": (
        "the harbour fell silent when the last boats were sold and the women mended nets on the quay "
        "we salted the pilchards in the cellars under the houses and carried bread to the men at dawn "
        "the mine closed and the young people moved away to the cities looking for work"
    ).split(),
    "lg-deu": (
        "als die zeche stillgelegt wurde zogen die jungen leute weg und die siedlung wurde still "
        "der staub war das schlimmste und viele kumpel bekamen die staublunge unter tage "
        "wir gingen sonntags zum förderturm und sprachen über die alten zeiten"
    ).split(),
    "lg-cat": (
        "la colònia es va buidar quan la fàbrica va tancar i les famílies van marxar a barcelona "
        "el soroll dels telers era tan fort que ens xiulaven les orelles en sortir del torn de nit "
        "la sirena marcava l'hora d'entrar l'hora de dinar i fins i tot l'hora de la missa"
    ).split(),
}
_LANGS = tuple(_WORDS)


def _sentence(rng: random.Random, lang: str, words: int) -> str:
    picked = [rng.choice(_WORDS[lang]) for _ in range(words)]
    return " ".join(picked).capitalize() + "."


def _paragraph(rng: random.Random, lang: str, sentences: int) -> str:
    return " ".join(_sentence(rng, lang, rng.randint(8, 22)) for _ in range(sentences))


def make_records(n: int, *, seed: int = 0, first_id: int = 1) -> list[dict[str, Any]]:
    """``n`` deterministic records over the demo sections: a third oral histories (summary +
    timecoded transcription), a third coin cards, a third museum objects (card + long document
    with headings and page markers); languages rotate through Spanish, English, German, Catalan."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        section_id = first_id + i
        lang = _LANGS[i % len(_LANGS)]
        kind = i % 3
        title = f"Record {section_id}: " + _sentence(rng, lang, 4)[:-1]
        if kind == 0:
            turns = []
            for t in range(rng.randint(4, 9)):
                speaker = "Entrevista" if t % 2 == 0 else "Testimoni"
                turns.append(
                    f"[TC_00:{t:02d}:{rng.randint(0, 59):02d}_TC] {speaker}: {_paragraph(rng, lang, rng.randint(1, 4))}"
                )
            groups = {
                "summary": {lang: _paragraph(rng, lang, 3)},
                "transcription": {lang: "\n".join(turns) + f"\n[TC_00:{len(turns):02d}:59_TC]"},
            }
            section = "oh1"
        elif kind == 1:
            groups = {
                "card": {lang: f"Inventory MN-{2000 + section_id}-{i:04d}. " + _paragraph(rng, lang, 3)}
            }
            section = "numisdata4"
        else:
            parts = [f"[h1] {_sentence(rng, lang, 5)[:-1]}"]
            for page in range(1, rng.randint(2, 4) + 1):
                parts.append(f"[page-n-{page}]")
                parts.append(f"[h2] {_sentence(rng, lang, 3)[:-1]}")
                parts.extend(
                    _paragraph(rng, lang, rng.randint(2, 5)) + "\n" for _ in range(rng.randint(1, 3))
                )
            groups = {"card": {lang: _paragraph(rng, lang, 2)}, "fulltext": {lang: "\n".join(parts)}}
            section = "mus1"
        records.append(
            {
                "section_tipo": section,
                "section_id": section_id,
                "projects": [1 + i % 3],
                "title": {lang: title},
                "groups": groups,
            }
        )
    return records


async def _write_baselines(pool: asyncpg.Pool, source: ModelPartition, dimension: int) -> dict[str, float]:
    """rows/s of the indexer's multi-row upsert vs one INSERT per chunk, on the same rows; and both
    again into partitions without their HNSW index, which shows how much of a write is the index.

    With an HNSW index every row costs a graph insert (a search of ``ef_construction`` candidates)
    whatever the statement shape, so batching can only save the rest: the speedup of any batching
    that keeps the index maintained is bounded by ``row-at-a-time time / HNSW time`` (``ceiling``).
    """
    records = await store.read_rows(pool, source, "text")

    async def write(partition: ModelPartition, one_row_per_statement: bool) -> float:
        started = time.perf_counter()
        for chunk_rows in records.values():
            async with pool.acquire() as conn, conn.transaction():
                if one_row_per_statement:
                    for row in chunk_rows:  # the anti-pattern: one round trip per chunk
                        await store.upsert_rows(conn, partition, [row])
                else:
                    await store.upsert_rows(conn, partition, chunk_rows)
        return time.perf_counter() - started

    seconds: dict[str, float] = {}
    for name, one_row in (("multirow", False), ("row-at-a-time", True)):
        for indexed in (True, False):
            partition = await ensure_partition(
                pool, f"bench-write-{name}" + ("" if indexed else "-no-hnsw"), dimension
            )
            if not indexed:
                await pool.execute(f'DROP INDEX IF EXISTS "{partition.partition}_hnsw"')
            seconds[name + ("" if indexed else " no-hnsw")] = await write(partition, one_row)
            await pool.execute(f"TRUNCATE {partition.table}")
    n = sum(len(r) for r in records.values())
    multi, single = seconds["multirow"], seconds["row-at-a-time"]
    hnsw_s = max(multi - seconds["multirow no-hnsw"], 1e-9)  # the same rows' graph inserts
    return {
        "rows": n,
        "records": len(records),
        "rows_per_record": n / max(len(records), 1),
        "multirow_rows_per_s": n / multi if multi else float("nan"),
        "row_at_a_time_rows_per_s": n / single if single else float("nan"),
        "multirow_no_hnsw_rows_per_s": n / seconds["multirow no-hnsw"],
        "row_at_a_time_no_hnsw_rows_per_s": n / seconds["row-at-a-time no-hnsw"],
        "hnsw_share_of_multirow": hnsw_s / multi,
        "multirow_speedup_ceiling": single / hnsw_s,
    }


class RecordingClient(SidecarClient):
    """The real client, keeping the texts sent to ``/embed`` (the embed-only baseline resends them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.embedded: list[str] = []
        self.recording = False

    async def _request(self, route: Route, **fields: Any) -> Any:
        """Every ``/embed`` call's texts, kept once answered (the client's own calls, not rewritten)."""
        answer = await super()._request(route, **fields)
        if self.recording and route is EMBED:
            self.embedded.extend(fields["input"])
        return answer


async def _prepared(pool: asyncpg.Pool, client: RecordingClient, text_model: str | None) -> Any:
    """The demo sections stored, the text model resolved, and the sidecar and the model's partition
    warmed outside the timings; the model."""
    sections = SectionStore(pool)
    for tipo, descriptor in demo_sections().items():
        await sections.put(tipo, descriptor)
    model = await resolve_model(client, "text", text_model)
    await client.embed(model.id, ["warm-up"] * 8, truncate=True)
    if await get_partition(pool, model.id) is None:
        await ensure_partition(pool, model.id, model.dimension or 0)
    return model


async def embed_alone(
    client: SidecarClient, model: str, texts: Sequence[str], batch: int, callers: int = 1
) -> float:
    """Seconds to embed ``texts`` alone, in the drain's ``batch``-sized requests sent by ``callers``
    at once: the baseline the drain is held to."""
    cursor = (list(texts[i : i + batch]) for i in range(0, len(texts), batch))

    async def caller() -> None:
        for some in cursor:  # one shared iterator: each request is sent once
            await client.embed(model, some, truncate=True)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return time.perf_counter() - started


async def run_ingest_benchmark(
    pool: asyncpg.Pool,
    client: RecordingClient,
    *,
    records: int = 200,
    text_model: str | None = None,
    settings: IngestSettings | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Ingest ``records`` synthetic records end to end and measure; returns the figures.

    ``client`` is a :class:`RecordingClient` (the real client, remembering what it embedded).
    The database should hold nothing of the demo sections (ids start at 1).
    """
    settings = settings or IngestSettings()
    model = await _prepared(pool, client, text_model)
    collection = make_records(records, seed=seed)
    started = time.perf_counter()
    for start in range(0, len(collection), settings.max_records_per_request):
        await enqueue_records(pool, collection[start : start + settings.max_records_per_request])
    intake_s = time.perf_counter() - started

    client.recording = True
    started = time.perf_counter()
    first = await drain_once(pool, client, settings, text_model=model.id)
    drain_s = time.perf_counter() - started
    client.recording = False
    if first.failed or first.indexed != records or first.unavailable:
        raise RuntimeError(f"the benchmark drain did not index everything: {first}")

    partition = await get_partition(pool, model.id)
    assert partition is not None
    texts = list(client.embedded)
    if len(texts) != first.chunks_embedded:
        raise RuntimeError(f"recorded {len(texts)} embedded texts, the drain reports {first.chunks_embedded}")
    embed_only_s = await embed_alone(client, model.id, texts, settings.embed_batch)

    # Incremental: the same collection again embeds nothing.
    await enqueue_records(pool, collection)
    started = time.perf_counter()
    again = await drain_once(pool, client, settings, text_model=model.id)
    again_s = time.perf_counter() - started

    writes = await _write_baselines(pool, partition, model.dimension or 0)
    phases = {k: round(v, 4) for k, v in first.seconds.items()}
    return {
        "model": model.id,
        "device": model.device,
        "records": records,
        "chunks_embedded": first.chunks_embedded,
        "rows_written": first.rows_written,
        "truncated": first.truncated,
        "intake_records_per_s": records / intake_s,
        "drain_seconds": drain_s,
        "records_per_s": records / drain_s,
        "chunks_per_s": first.chunks_embedded / drain_s,
        "phase_seconds": phases,
        "phase_share": {k: v / drain_s for k, v in first.seconds.items()},
        "embed_share": first.seconds.get("embed", 0.0) / drain_s,
        "write_share": first.seconds.get("write", 0.0) / drain_s,
        "embed_only_chunks": len(texts),
        "embed_only_chunks_per_s": len(texts) / embed_only_s,
        "pipeline_efficiency": (first.chunks_embedded / drain_s) / (len(texts) / embed_only_s),
        "reindex_unchanged_records_per_s": records / again_s,
        "reindex_chunks_embedded": again.chunks_embedded,
        "reindex_rows_written": again.rows_written,
        "write_baseline": writes,
        "multirow_speedup": writes["multirow_rows_per_s"] / writes["row_at_a_time_rows_per_s"],
        "settings": {"batch_records": settings.batch_records, "embed_batch": settings.embed_batch},
    }


# Each headline of one ingest run, read from its result.
HEADLINES = (
    HeadlineRow("ingest chunks/s", "{chunks_per_s}", "chunks/s", "embed-only", "{embed_only_chunks_per_s}", bar=0.7),
    HeadlineRow("multi-row writes", "{write_baseline[multirow_rows_per_s]}", "rows/s", "row-at-a-time",
                "{write_baseline[row_at_a_time_rows_per_s]}", bar=2.0),
    HeadlineRow("re-index unchanged", "{reindex_unchanged_records_per_s}", "records/s", "first ingest", "{records_per_s}"),
)  # fmt: skip
# A statement shape of the write baseline, with its "shape" and its two rates' keys.
WRITES = (
    Column("statement shape", "{shape}"),
    Column("rows/s, HNSW maintained", "{with_index}"),
    Column("rows/s, no HNSW index", "{without_index}"),
)


def as_suite(result: dict[str, Any]) -> SuiteResult:
    """The figures as a report suite (headlines against same-run baselines)."""
    shares, w = result["phase_share"], result["write_baseline"]
    shapes = [{"shape": "one multi-row upsert per record", "with_index": w["multirow_rows_per_s"],
               "without_index": w["multirow_no_hnsw_rows_per_s"]},
              {"shape": "one INSERT per chunk", "with_index": w["row_at_a_time_rows_per_s"],
               "without_index": w["row_at_a_time_no_hnsw_rows_per_s"]}]  # fmt: skip
    return SuiteResult(
        suite="ingest",
        headlines=[h.read(result) for h in HEADLINES],
        tables=[
            Table(
                "Where the drain's time goes",
                ["phase", "seconds", "share"],
                [[p, result["phase_seconds"][p], shares[p]] for p in sorted(shares)],
            ),
            Table(
                "Writes: statement shape vs the HNSW insert (same rows)",
                headings(WRITES),
                rows(WRITES, shapes),
            ),
        ],
        figures={k: v for k, v in result.items() if not isinstance(v, dict)},
        notes=[
            f"{result['records']} records, {result['chunks_embedded']} chunks embedded with "
            f"{result['model']} on {result['device']}: {result['records_per_s']:.1f} records/s, "
            f"{result['chunks_per_s']:.1f} chunks/s.",
            f"Re-indexing the unchanged collection embedded {result['reindex_chunks_embedded']} chunks "
            f"and wrote {result['reindex_rows_written']} rows.",
            f"Writes: {w['rows']} rows in {w['records']} records ({w['rows_per_record']:.1f} per record). The "
            f"HNSW graph insert is {100 * w['hnsw_share_of_multirow']:.0f}% of the multi-row upsert's time; it "
            f"is paid per row whatever the statement, so no batching that keeps the index maintained can beat "
            f"{w['multirow_speedup_ceiling']:.2f}x row-at-a-time (row-at-a-time time / HNSW time). Without the "
            f"index the multi-row upsert is "
            f"{w['multirow_no_hnsw_rows_per_s'] / w['row_at_a_time_no_hnsw_rows_per_s']:.2f}x row-at-a-time.",
        ],
    )
