"""The lexical leg on Tantivy on disk: a read-only engine every gateway process opens.

The indexes are written by one writer (:mod:`index.lexical.writer`, ``mnemo lexical follow``) under
the lexical folder (layout in :mod:`index.lexical.files`); a gateway only reads them, memory-mapped.

How a search stays the SQL leg's answer:

- **Fresh reader.** Each search checks (two system calls) whether the partition's ``current`` link
  or its watermark file changed; if so it reads the watermark file *first*, then reloads the index,
  so the index it searches holds at least what that watermark says.
- **Candidates from Tantivy.** The query's scored terms (PostgreSQL's own parse,
  :func:`index.search.bm25.query_terms`) as one boolean query: any *selective* term must match (the SQL
  leg's match set, :func:`index.search.bm25.bm25_plan`), the common ones only add to the score, each
  boosted by its query frequency; the scope's permitted access classes (evaluated by the legs' own
  SQL over the classes the watermark file lists) and sections filter inside the query, so a narrow
  scope is never starved by a post-filter (a scope of a few classes reads those classes' own
  postings instead: ``klex``, :meth:`TantivyLexical._class_terms`). Tantivy ranks by its own BM25 (its statistics, its
  quantized lengths) without counting the matches (so it skips blocks that cannot rank): it only
  *selects*, ``overfetch`` times ``limit`` candidates.
- **Exact scores from the index.** Each candidate's stored document holds what the SQL leg's BM25
  reads of the row (its lexeme counts and ``lexical_length``): it is scored here by the SQL leg's
  formula (:func:`index.search.bm25.bm25_summand`) with the index's own corpus statistics
  (:mod:`index.lexical.stats`: counted in the mapped index, never a PostgreSQL probe), and the
  candidates are ranked by that score.
- **ACL and freshness from PostgreSQL.** The best ``limit + 8`` (widened while too few come back
  unchanged) plus every key changed after the watermark are re-read from the store through the
  scope's SQL filter and the plan's match set (:func:`index.search.lexical_reread.reread_candidates`): an unchanged candidate keeps its exact score, a changed key is
  scored by the SQL leg's own expression. Scores and order are the SQL leg's (its expression under
  the index's statistics: equal to its answer once the writer has caught up), a deleted row or a
  revoked ACL is never served (the index can only hide a row, never reveal one), and a row written
  after the watermark is found.

Behind: when the store holds more than ``max_behind`` changes past the watermark (the writer is
stopped or far behind), the SQL leg serves, counted as ``behind``.

Another store: the watermark file names the database the index was built from
(:func:`index.store.change_feed.store_identity`) and its documents' format
(:data:`index.lexical.files.FORMAT`); an index of another database (or a reset one) or of another
format is never searched, the SQL leg serves it (counted as ``cold``, shown as ``foreign``) until
the writer rebuilds it.

Found without a restart: the ``current`` link is read on every search (one ``readlink``), so an
index that a writer started after the gateway builds (the folder itself created late included) is
searched from the next search on; until then the partition is ``missing`` (or ``building`` while a
build's folder exists without a link) and the SQL leg serves.

What is not exact: when more than ``overfetch * limit`` rows match, Tantivy's top may miss a row
the SQL leg's exact BM25 ranks in the top ``limit`` (how often: ``benchmarks/results/2026-12-04/
tantivy-recall``). A partition without an index (never built, or missing) and image rows go to the SQL
leg, counted in ``mnemo_lexical_searches``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import asyncpg
import numpy as np
import tantivy

from index.follow.folder_state import folder_reports, too_far_behind
from index.lexical.files import (
    CURRENT,
    STATE_FILE,
    IndexState,
    any_term,
    class_term,
    current_folder,
    describe,
    key_of,
    lexical_schema,
    read_state,
    record_text,
    term_counts_of,
)
from index.lexical.metrics import LexicalMetrics
from index.lexical.stats import IndexStats, index_corpus, index_doc_freqs
from index.lru import Lru
from index.search.access_classes import permitted_classes
from index.search.bm25 import (
    SCORE_DECIMALS,
    Bm25Plan,
    bm25_idf,
    bm25_plan_of_counts,
    bm25_summand,
    count_doc_freqs,
    query_terms,
    scored_terms,
)
from index.search.lexical_engine import Connections
from index.search.lexical_reread import reread_candidates
from index.search.read_settings import CUSTOM_PLANS, PLANNED_ONCE
from index.settings import IngestSettings
from index.store.change_feed import Watermark, store_identity
from index.store.hits import ChunkHit, Scope, chunk_from_row, scope_key
from index.store.partitions import ModelPartition

log = logging.getLogger(__name__)

__all__ = ["AUTO_MODE", "MODE", "MODES", "SCOPED_CLASSES_MAX", "TantivyConfig", "TantivyLexical"]

MODE = "tantivy"  # RAG_LEXICAL_INDEX value that selects this engine
# The default: this engine too, wherever the writer has built an index; the SQL leg elsewhere. It
# differs from `tantivy` in what it promises: nothing needs to exist for a gateway to start and serve.
AUTO_MODE = "auto"
MODES = (AUTO_MODE, MODE)
# A scope that permits at most this many access classes is searched in those classes' own postings
# (the ``klex`` field) rather than in every row's, filtered by class: each term then costs one
# posting list a class, so past a handful of classes the filter is cheaper.
SCOPED_CLASSES_MAX = 8


@dataclass(frozen=True)
class TantivyConfig:
    # Candidates asked of Tantivy per result (at least limit + 8), each read and scored exactly:
    # more finds more of the SQL leg's exact top (Tantivy selects by its own BM25) at about 7 us a
    # candidate. At 2 the recall of the exact top was 1.000 on every real data set and 0.964-0.980
    # on a 100k Zipf corpus (4: 0.997-0.999; benchmarks/results/2026-12-04/tantivy-recall); at 1M
    # the leg's p50 at 4 was about 1.2-1.3x its p50 at 2 (one profiling run, legs interleaved).
    overfetch: int = 2
    scope_cache_size: int = 256
    # Every change after the index's watermark is re-read by every search: past this many (the
    # writer stopped or far behind) the SQL leg serves instead, counted as `behind`.
    max_behind: int = IngestSettings.lexical_max_behind  # RAG_LEXICAL_MAX_BEHIND
    head_check_s: float = 1.0  # how long the store's latest change number is taken as current
    # How long the index's BM25 statistics of a section scope are held (0: counted on every search);
    # the gateway passes the SQL leg's RAG_LEXICAL_STATS_TTL.
    stats_ttl_s: float = 60.0

    def __post_init__(self) -> None:
        if self.overfetch < 1 or self.max_behind < 0 or self.head_check_s < 0 or self.stats_ttl_s < 0:
            raise ValueError(
                "tantivy lexical engine: overfetch >= 1, max_behind >= 0, head_check_s >= 0, stats_ttl_s >= 0"
            )

    def candidates(self, limit: int) -> int:
        """How many candidates Tantivy is asked for to serve ``limit`` results (:attr:`overfetch`)."""
        return max(limit * self.overfetch, limit + 8)


@dataclass
class _Reader:
    """One partition's open index and the watermark file it was opened at."""

    folder: Path
    index: tantivy.Index
    state: IndexState
    stamp: tuple[int, int]  # the watermark file's inode and mtime when it was read
    # Per scope: the permitted class ids among the first n of state.classes (n = how many were evaluated).
    scopes: Lru[Hashable, tuple[int, list[int]]] = field(default_factory=lambda: Lru(256))
    # Per section scope (None: all): the index's BM25 statistics (index.lexical.stats).
    stats: Lru[Hashable, IndexStats] = field(default_factory=lambda: Lru(256))
    # The partition's `current` link and this folder's watermark file, as strings (TantivyLexical._unchanged).
    paths: tuple[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.paths = (str(self.folder.parent / CURRENT), str(self.folder / STATE_FILE))


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


class TantivyLexical:
    """The lexical leg from the on-disk Tantivy indexes (read only); None from search: the SQL leg serves."""

    def __init__(
        self,
        root: Path,
        config: TantivyConfig | None = None,
        metrics: LexicalMetrics | None = None,
        *,
        mode: str = MODE,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"tantivy lexical engine mode {mode!r}: use one of {MODES}")
        self.mode = mode
        self.root = root
        self.config = config or TantivyConfig()
        self.metrics = metrics or LexicalMetrics()
        self.schema = lexical_schema()
        self.readers: dict[str, _Reader] = {}
        self._heads: dict[str, tuple[float, int]] = {}  # partition -> (when read, the store's latest seq)
        self._store: str | None = None  # this store's identity, read on the first search

    async def start(self) -> None:
        """Nothing to load: each partition's index opens on its first search, so a missing folder
        never stops the gateway (said once here: explicitly configured, it is likely a mistake)."""
        if not self.root.is_dir():
            level = logging.WARNING if self.mode == MODE else logging.INFO
            log.log(
                level,
                "lexical engine (%s): no index folder at %s yet; the SQL leg serves until `mnemo lexical "
                "follow` builds one",
                self.mode,
                self.root,
            )

    async def stop(self) -> None:
        self.readers.clear()

    # -- readers -----------------------------------------------------------------------------------

    def _open(self, partition: ModelPartition, folder: Path, stamp: tuple[int, int]) -> _Reader | None:
        state = read_state(folder)  # first: the index opened after it holds at least this much
        if state is None:
            return None
        index = tantivy.Index.open(str(folder))
        self._observe(partition, folder, state)
        return _Reader(folder, index, state, stamp, Lru(self.config.scope_cache_size))

    def _reload(self, held: _Reader, partition: ModelPartition, state: IndexState) -> None:
        """Reload the held index after a commit and observe it (one hand-off to a thread)."""
        held.index.reload()
        self._observe(partition, held.folder, state)

    def _observe(self, partition: ModelPartition, folder: Path, state: IndexState) -> None:
        """The opened index in ``mnemo_lexical_bytes`` (its files on disk: mapped, so shared by
        every worker through the page cache) and ``mnemo_lexical_chunks`` (its documents)."""
        try:
            size = sum(e.stat().st_size for e in os.scandir(folder) if e.is_file())
        except FileNotFoundError:  # swapped out and removed meanwhile: the next search reopens
            return
        self.metrics.bytes.labels(partition.partition).set(size)
        self.metrics.chunks.labels(partition.partition).set(state.documents)

    def _unchanged(self, held: _Reader) -> bool:
        """The held reader's index is still current: its link names its folder and its watermark
        file is the one it read. The same two system calls as the full check, on the paths as held
        strings (the Path arithmetic cost about as much as the calls, on every search)."""
        link, state_file = held.paths
        try:
            if os.readlink(link) != held.folder.name:
                return False
            st = os.stat(state_file)
        except FileNotFoundError:
            return False
        return (st.st_ino, st.st_mtime_ns) == held.stamp

    async def reader(self, partition: ModelPartition) -> _Reader | None:
        """The partition's reader, reopened or reloaded when the writer committed or a rebuild swapped."""
        held = self.readers.get(partition.partition)
        if held is not None and self._unchanged(held):
            return held
        folder = current_folder(self.root, partition)
        if folder is None:
            self.readers.pop(partition.partition, None)
            return None
        stamp = _stamp(folder / STATE_FILE)
        if stamp is None:
            return None
        if held is not None and held.folder == folder and held.stamp == stamp:
            return held
        if held is not None and held.folder == folder:
            state = read_state(folder)
            if state is None:
                return None
            await asyncio.to_thread(self._reload, held, partition, state)
            if state.classes != held.state.classes:
                held.scopes = Lru(self.config.scope_cache_size)
            held.state, held.stamp = state, stamp
            return held
        opened = await asyncio.to_thread(self._open, partition, folder, stamp)
        if opened is None:
            return None
        self.readers[partition.partition] = opened
        return opened

    async def _allowed(self, conn: asyncpg.Connection, reader: _Reader, scope: Scope) -> list[int] | None:
        """The class ids the scope (without its excluded record) permits; None: every class."""
        scope = replace(scope, exclude_record=None)
        if scope == Scope():
            return None
        key = scope_key(scope)
        ids = list(reader.state.classes)
        evaluated, allowed = reader.scopes.get(key) or (0, [])
        if evaluated < len(ids):
            classes = [reader.state.classes[i] for i in ids[evaluated:]]
            positions = await permitted_classes(conn, classes, scope, evaluated)
            allowed = [*allowed, *(ids[p] for p in positions)]
            reader.scopes.put(key, (len(ids), allowed))
        return allowed

    async def behind(self, conn: asyncpg.Connection, partition: ModelPartition, reader: _Reader) -> int:
        """Changes the store holds past the reader's watermark (the store's head read at most every
        ``head_check_s``)."""
        now = time.monotonic()
        seen = self._heads.get(partition.partition)
        if seen is None or now - seen[0] >= self.config.head_check_s:
            head = await conn.fetchval(
                "SELECT coalesce(max(seq), 0) FROM rag_embedding_changes WHERE model = $1", partition.model
            )
            seen = self._heads[partition.partition] = (now, int(head))
        return max(0, seen[1] - reader.state.watermark.seq)

    # -- search ------------------------------------------------------------------------------------

    def _query(
        self,
        searcher: tantivy.Searcher,
        plan: Bm25Plan,
        terms: dict[str, int],
        scope: Scope,
        allowed: list[int] | None,
    ) -> tantivy.Query:
        """Any selective term must match, the common ones add to the score, the scope filters. The
        plain case (every term selective, no filter) is one flat disjunction of unboosted term
        queries where a term appears once, the shape Tantivy scores fastest (0.65 against 0.77 ms
        at 1M chunks, with the same matches). A scope of at most :data:`SCOPED_CLASSES_MAX`
        classes asks each term in each class's own ``klex`` postings instead of filtering every
        match of the term by class (:meth:`_class_terms`)."""
        scoped = allowed is not None and len(allowed) <= SCOPED_CLASSES_MAX

        def term(t: str) -> list[tantivy.Query]:
            if scoped:
                return self._class_terms(searcher, t, allowed or [], terms[t])
            query = tantivy.Query.term_query(self.schema, "lex", t)
            return [query if terms[t] == 1 else tantivy.Query.boost_query(query, float(terms[t]))]

        def only(query: tantivy.Query) -> tantivy.Query:  # a filter: must match, adds nothing
            return tantivy.Query.const_score_query(query, 0.0)

        should, must = tantivy.Occur.Should, tantivy.Occur.Must
        any_selective = [(should, q) for t in plan.selective for q in term(t)]
        filters: list[tuple[tantivy.Occur, tantivy.Query]] = []
        if allowed is not None and not scoped:
            filters.append((must, only(any_term(self.schema, "klass", allowed))))
        if scope.section_tipos is not None:
            filters.append((must, only(any_term(self.schema, "section", list(scope.section_tipos)))))
        if scope.exclude_record is not None:
            record = tantivy.Query.term_query(self.schema, "record", record_text(*scope.exclude_record))
            filters.append((tantivy.Occur.MustNot, record))
        selective = set(plan.selective)
        common = [(should, q) for t in plan.terms if t not in selective for q in term(t)]
        if not common and not filters:
            return tantivy.Query.boolean_query(any_selective)
        return tantivy.Query.boolean_query(
            [(must, tantivy.Query.boolean_query(any_selective)), *common, *filters]
        )

    def _class_terms(
        self, searcher: tantivy.Searcher, term: str, classes: Sequence[int], frequency: int
    ) -> list[tantivy.Query]:
        """``term`` in each class's ``klex`` postings (none for a class that holds none), boosted so
        that Tantivy's BM25 of it is the one of ``term`` in ``lex``: the same lengths, its IDF over
        the whole index instead of over the class. Candidates rank as under a class filter, at the
        cost of the classes' postings alone (at 1M chunks, a scope of 1% of the rows: 2.26 against
        2.70 ms a search, the same answers on 60 of 60 queries)."""
        df = searcher.doc_freq("lex", term)  # >= any class's: every klex posting has its lex one
        # A deleted document counts in a term's frequency until a merge drops it, never in num_docs:
        # n at least df keeps both IDFs positive, so a boost never turns a class's matches last.
        n = max(searcher.num_docs, df)
        queries = []
        for klass in classes:
            scoped = class_term(klass, term)
            df_class = searcher.doc_freq("klex", scoped)
            if df_class:
                boost = frequency * bm25_idf(n, df) / bm25_idf(n, df_class)
                queries.append(
                    tantivy.Query.boost_query(tantivy.Query.term_query(self.schema, "klex", scoped), boost)
                )
        return queries

    async def _plan(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        reader: _Reader,
        terms: dict[str, int],
        sections: tuple[str, ...] | None,
    ) -> Bm25Plan | None:
        """The query's BM25 plan under the index's statistics for the section scope (held
        ``stats_ttl_s``; a term counted on first use). A term the index does not hold is counted in
        the store on every search (cheap: it is rare there, if it exists at all), so a row written
        after the watermark with a new word is still found. The index's counts run off the event
        loop; the cache is only touched on it."""
        key = None if sections is None else tuple(sorted(set(sections)))
        stats = reader.stats.get(key)
        if stats is None or time.monotonic() - stats.at >= self.config.stats_ttl_s:
            stats = await asyncio.to_thread(index_corpus, reader.index.searcher(), self.schema, key)
            reader.stats.put(key, stats)
        missing = [t for t in terms if t not in stats.df]
        if missing:
            searcher = reader.index.searcher()
            stats.df.update(await asyncio.to_thread(index_doc_freqs, searcher, self.schema, missing, key))
        df = {t: stats.df[t] for t in terms}
        absent = [t for t, n in df.items() if n == 0]
        if absent:
            df.update(await count_doc_freqs(conn, partition, absent, key))
        chunks = max(stats.n, *df.values())  # an index still empty: the store's rows are pending
        return bm25_plan_of_counts(terms, df, chunks, stats.avgdl)

    def _candidates(
        self, searcher: tantivy.Searcher, query: tantivy.Query, fetch: int, plan: Bm25Plan
    ) -> tuple[list[tantivy.Document], list[float | None]]:
        """Tantivy's top ``fetch`` (its own BM25 selects them) as their stored documents, each with
        the SQL leg's exact score from its lexeme counts and length (None: a document that holds no
        counts, first), best first."""
        hits = searcher.search(query, fetch, count=False).hits  # no count: Tantivy skips what cannot rank
        addresses = [address for _score, address in hits]
        docs = [searcher.doc(address) for address in addresses]
        counts = [(d["tfs"] or [None])[0] for d in docs]
        lengths = np.asarray(searcher.fast_field_values("dl", addresses), dtype=np.int64)
        weights = np.asarray(plan.weights, dtype=np.float64)[:, None]
        # Summed term by term in the plan's order.
        total = bm25_summand(weights, term_counts_of(counts, plan.terms), lengths, plan.avgdl).sum(axis=0)
        total = np.round(total, SCORE_DECIMALS)  # the SQL leg's ties stay ties (SCORE_DECIMALS says why)
        unscored = np.array([c is None for c in counts], dtype=bool)
        order = np.argsort(np.where(unscored, -np.inf, -total), kind="stable").tolist()
        return [docs[i] for i in order], [None if unscored[i] else float(total[i]) for i in order]

    async def search(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        query: str,
        scope: Scope,
        limit: int,
        *,
        modality: str = "text",
        reread: Connections | None = None,
    ) -> list[ChunkHit] | None:
        """The lexical top-``limit`` for ``scope`` scored by the SQL leg, or None: use the SQL leg.
        The candidates are re-read on a connection of ``reread`` (planned once per session,
        :data:`~index.search.read_settings.PLANNED_ONCE`) when given, else on ``conn``."""
        if modality != "text":
            self.metrics.searches.labels("image").inc()
            return None
        reader = await self.reader(partition)
        if reader is None:
            self.metrics.searches.labels("cold").inc()
            return None
        if self._store is None:
            self._store = await store_identity(conn)
        if not reader.state.searchable_in(self._store):
            self.metrics.searches.labels("cold").inc()
            return None
        watermark = reader.state.watermark  # the index holds at least this: every later change is re-read
        if too_far_behind(await self.behind(conn, partition, reader), self.config.max_behind):
            self.metrics.searches.labels("behind").inc()
            return None
        terms = scored_terms(await query_terms(conn, query))
        if not terms:
            self.metrics.searches.labels("hit").inc()
            return []
        plan = await self._plan(conn, partition, reader, terms, scope.section_tipos)
        if plan is None:
            self.metrics.searches.labels("hit").inc()
            return []
        allowed = await self._allowed(conn, reader, scope)
        docs: list[tantivy.Document] = []
        scores: list[float | None] = []
        if allowed is None or allowed:
            searcher = reader.index.searcher()  # one view of the index: the query's counts, its hits
            tq = self._query(searcher, plan, terms, scope, allowed)
            fetch = self.config.candidates(limit)
            # On the event loop: at 1M chunks a thread's hand-off cost 0.7 ms of a 4.6 ms search
            # (interleaved windows), more than the 1-2 ms it frees.
            docs, scores = self._candidates(searcher, tq, fetch, plan)
        # On the search's own connection, planned at every run, or on one of ``reread``'s, planned once.
        on, plans = (
            (contextlib.nullcontext(conn), CUSTOM_PLANS)
            if reread is None
            else (reread.acquire(), PLANNED_ONCE)
        )
        async with on as reread_conn:
            rows = await self._reread(
                reread_conn, plans, partition, plan, scope, docs, scores, watermark, limit
            )
        self.metrics.searches.labels("hit").inc()
        return [chunk_from_row(r, float(r["score"])) for r in rows[:limit]]

    async def _reread(
        self,
        conn: asyncpg.Connection,
        plans: Mapping[str, str],
        partition: ModelPartition,
        plan: Bm25Plan,
        scope: Scope,
        docs: Sequence[tantivy.Document],
        scores: Sequence[float | None],
        watermark: Watermark,
        limit: int,
    ) -> list[asyncpg.Record]:
        """The best candidates re-read (:func:`index.search.lexical_reread.reread_candidates`): the first
        ``limit + 8`` (those without a score first, then by their exact scores, and every one tied
        with the last, so PostgreSQL breaks the tie), widened while fewer than ``limit`` of them
        come back unchanged since the watermark (changed ones were re-scored, hidden ones dropped)."""
        take = limit + 8
        while True:
            cut = min(take, len(docs))
            while cut < len(docs) and scores[cut] is not None and scores[cut] == scores[cut - 1]:
                cut += 1
            rows, trusted = await reread_candidates(
                conn,
                partition,
                plan,
                scope,
                [key_of(d["key"][0]) for d in docs[:cut]],
                scores[:cut],
                watermark,
                plans=plans,
            )
            if trusted >= limit or cut >= len(docs):
                return rows
            take *= 4

    async def status(
        self, conn: asyncpg.Connection, partitions: Sequence[ModelPartition]
    ) -> dict[str, object]:
        """The /readyz detail: the mode, the folder, and per partition its index's state in the one
        vocabulary (:mod:`index.follow.folder_state`, as ``mnemo lexical status`` says it: ``ready``
        is what this engine searches, every other state leaves the partition to the SQL leg), with
        ``open`` (this process has opened it: a partition is opened on its first search) and, when
        open, seconds since the writer last stamped it (``age_s``)."""
        reports = await folder_reports(conn, self.root, partitions, describe, self.config.max_behind)
        for name, report in reports.items():
            reader = self.readers.get(name)
            report["open"] = reader is not None
            if reader is not None:
                report["age_s"] = round(max(0.0, time.time() - reader.stamp[1] / 1e9), 1)
        return {"mode": self.mode, "running": True, "root": str(self.root), "partitions": reports}
