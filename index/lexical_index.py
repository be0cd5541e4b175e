"""The in-memory lexical index: each model partition's BM25 postings in the gateway's process.

Why (issue 24): the SQL lexical leg scores BM25 over the GIN index with OR semantics, so a common
query term walks a long posting list in PostgreSQL on every search; at 100k chunks it was the leg
that grew, 24x behind a search engine at the median. Here each term's postings are three numpy
arrays (chunk slot, term frequency, the chunk's length), and a query is a vectorized gather and sum
over its terms, with MaxScore skipping what cannot reach the top k (:meth:`PartitionLexicon._top_max_score`).

How it stays correct (the invariants the tests pin):

- **Same scores.** Corpus statistics (chunk count, mean ``lexical_length``, document frequency per
  term, over the query's section scope) are counted exactly from the live postings, and the query
  plan is the SQL leg's (:func:`index.search.bm25_plan`). The index only *selects* candidates: their
  rows are re-read from the store and scored there by the SQL leg's own expression
  (:func:`index.search.bm25_score_sql`), so scores and tie order are the SQL leg's.
- **Exact ACL push-down.** The scope and ACL filter is the legs' own SQL (:func:`index.search.scope_where`),
  evaluated once per distinct *access class* of chunks (section, component, view, projects and the
  ACL arrays of migration 0013: a handful of rows, however many chunks) and cached per scope. A
  candidate is selected only when its class passes, so ``limit`` is never starved by a post-filter.
- **Never stale.** Each partition follows the change feed (:mod:`index.change_feed`) from a
  watermark. The re-read adds every key changed after it, scored in SQL, and trusts an index
  candidate only when its key has not changed since: the answer is exact while the index lags.
  When pending keys crowd the candidates the search widens; past a bound it says so (``fallback``)
  and the SQL leg serves.
- **Rebuildable.** Everything comes from the stored ``lexical`` tsvectors and ``lexical_length``.

Modes (``RAG_LEXICAL_INDEX``): ``off`` (the SQL leg, as before) or ``memory``. A partition still
loading (``cold``), one whose load failed, image rows and a ``fallback`` are served by the SQL leg
and counted in ``mnemo_lexical_searches``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import asyncpg
import numpy as np

from .access_classes import LEXICAL_ROW_COLUMNS, AccessClass, access_class, permitted_classes
from .change_feed import (
    KEY_COLUMNS,
    RowKey,
    Watermark,
    candidates_params,
    candidates_sql,
    changed_rows,
    current_watermark,
    row_key,
)
from .feed_follower import FeedFollower
from .lexical_metrics import LexicalMetrics
from .lru import Lru
from .partitions import ModelPartition
from .search import (
    BM25_B,
    BM25_K1,
    CUSTOM_PLANS,
    Bm25Plan,
    ChunkHit,
    Scope,
    bm25_idf,
    bm25_plan,
    bm25_score_sql,
    chunk_from_row,
    fetch_with_local_settings,
    hit_columns,
    identity_order,
    query_terms,
    scope_key,
    scope_where,
    scored_terms,
)

log = logging.getLogger(__name__)

__all__ = ["MODES", "LexicalConfig", "LexicalIndex", "PartitionLexicon"]

MODES = ("off", "memory")
DF_CACHE_SIZE = 65_536  # (term, section scope) document frequencies kept between writes
# MaxScore top-k (PartitionLexicon._top_max_score): tried when a query's terms hold at least this
# many postings together (below it, scoring every posting costs less than planning what to skip).
MAX_SCORE_MIN_POSTINGS = 4_096
PRUNE_MARGIN = 1e-7  # relative slack on every cut, far above float rounding, far below a score gap
LOOKUP_COST = 16  # a binary search per slot against a scan per posting: the break-even ratio
ScopeKey = Hashable
Postings = tuple[np.ndarray, np.ndarray, np.ndarray]  # one term's slots, term frequencies, chunk lengths


@dataclass(frozen=True)
class LexicalConfig:
    """How the index runs (built by the gateway from its settings)."""

    mode: str = "memory"
    load_batch: int = 20_000
    poll_s: float = 5.0  # safety net: catch up this often even without a notification
    scope_cache_size: int = 256
    # A search widens while pending changes crowd its candidates, up to this many times `limit`.
    max_fetch_factor: int = 64

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"lexical index mode {self.mode!r}: use one of {MODES}")


def _grown(array: np.ndarray, n: int) -> np.ndarray:
    """``array`` with room for at least ``n`` entries (doubling, zero-filled)."""
    if n <= len(array):
        return array
    out = np.zeros(max(n, 2 * len(array), 1024), dtype=array.dtype)
    out[: len(array)] = array
    return out


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``values`` sorted without repeats: ``np.unique``'s result, without its hash table (numpy 2's
    ``unique`` spent 5 ms on a few thousand slots where a sort takes 0.1)."""
    values = np.sort(values)
    if len(values) < 2:
        return values
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


@dataclass
class PartitionLexicon:
    """One partition's postings, slots, lengths, access classes, statistics and watermark.

    A chunk lives in a slot; an update or delete kills the key's slot (its postings stay, skipped
    as dead, until the term is next touched or the index is rebuilt) and an update takes a new one.
    """

    partition: ModelPartition
    state: str = "loading"  # loading | ready | failed
    watermark: Watermark = field(default_factory=lambda: Watermark(0, 0))
    size: int = 0  # slots used
    dead: int = 0  # slots whose chunk was deleted or updated since the load
    slot_of: dict[RowKey, int] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)  # one copy of each key text (see _shared)
    key_of: list[RowKey | None] = field(default_factory=list)
    record_slots: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    alive: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    length: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    section: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    klass: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    section_code: dict[str, int] = field(default_factory=dict)
    section_count: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    section_length: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    class_code: dict[AccessClass, int] = field(default_factory=dict)
    classes: list[AccessClass] = field(default_factory=list)
    # Per term: its postings' slots (ascending), term frequencies and chunk lengths. The lengths are
    # the slots' own (a slot's length never changes), kept beside them so that scoring a list reads
    # it in order instead of gathering lengths from every slot's column: 10x cheaper on a long list.
    postings: dict[str, Postings] = field(default_factory=dict)
    scopes: Lru[ScopeKey, np.ndarray] = field(default_factory=lambda: Lru(LexicalConfig.scope_cache_size))
    load_seconds: float | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Live document frequency per (term, section mask), kept until the next write (a search asks
    # for each query term's, and counting walks the term's whole posting list).
    df_cache: dict[tuple[str, bytes | None], int] = field(default_factory=dict)
    # Per term: (the mean length it was measured at, its largest BM25 summand per unit weight, at
    # least), measured by the load (long lists) or the first search that asks, raised by writes
    # (see _bound).
    term_bounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    # Per-slot scratch of top(), all False / 0 between calls: a search touches only its match set
    # instead of allocating and zeroing two arrays of every slot (9 MB a query at 1M chunks).
    scratch_member: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    scratch_total: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))

    @property
    def live(self) -> int:
        return int(self.alive[: self.size].sum())

    @property
    def nbytes(self) -> int:
        """Bytes of the numpy arrays (postings and per-slot columns); Python dicts come on top."""
        arrays = (self.alive, self.length, self.section, self.klass)
        return sum(a.nbytes for a in arrays) + sum(sum(a.nbytes for a in p) for p in self.postings.values())

    @property
    def posting_count(self) -> int:
        return sum(len(p[0]) for p in self.postings.values())

    # -- writes ------------------------------------------------------------------------------------

    def _forget(self, key: RowKey) -> None:
        slot = self.slot_of.pop(key, None)
        if slot is None:
            return
        self.alive[slot] = False
        self.dead += 1
        self.key_of[slot] = None
        code = self.section[slot]
        self.section_count[code] -= 1
        self.section_length[code] -= int(self.length[slot])
        slots = self.record_slots.get(key[:2])
        if slots is not None:
            slots.discard(slot)
            if not slots:
                del self.record_slots[key[:2]]

    def _shared(self, key: RowKey) -> RowKey:
        """``key`` with each text column (section, component, language, view) as the lexicon's one
        copy of that value: the driver decodes a new string per row, and a key is kept per chunk."""
        texts = self.texts
        tipo, section_id, component, lang, view, chunk = key
        return (texts.setdefault(tipo, tipo), section_id, texts.setdefault(component, component),
                texts.setdefault(lang, lang), texts.setdefault(view, view), chunk)  # fmt: skip

    def _code(self, codes: dict, value: Hashable) -> int:
        code = codes.get(value)
        if code is None:
            code = codes[value] = len(codes)
        return code

    def apply(self, rows: Sequence[asyncpg.Record]) -> tuple[int, int]:
        """Apply rows read with :data:`LEXICAL_ROW_COLUMNS` after their key: each key's old slot dies, a
        present row (non-NULL length) takes a new one. Returns (upserts, deletes)."""
        self.df_cache.clear()
        lexemes: list[str] = []
        slots: list[int] = []
        tfs: list[int] = []
        first = self.size
        n = first
        deletes = 0
        for row in rows:
            key = self._shared(row_key(row))
            self._forget(key)
            if row["lexical_length"] is None:
                deletes += 1
                continue
            n += 1
            self._place(key, n - 1, row)
            words = row["lexemes"] or ()
            lexemes.extend(words)
            slots.extend([n - 1] * len(words))
            tfs.extend(row["tfs"] or ())
        self.size = n
        self._add_postings(lexemes, np.asarray(slots, dtype=np.int32), _counts(tfs))
        self.alive[first:n] = True
        return n - first, deletes

    def _place(self, key: RowKey, slot: int, row: asyncpg.Record) -> None:
        if slot >= len(self.alive):
            self.alive = _grown(self.alive, slot + 1)
            self.length = _grown(self.length, slot + 1)
            self.section = _grown(self.section, slot + 1)
            self.klass = _grown(self.klass, slot + 1)
            self.key_of.extend([None] * (len(self.alive) - len(self.key_of)))
        access = access_class(key, row)
        klass = self._code(self.class_code, access)
        if klass == len(self.classes):
            self.classes.append(access)
        section = self._code(self.section_code, key[0])
        self.section_count = _grown(self.section_count, section + 1)
        self.section_length = _grown(self.section_length, section + 1)
        length = int(row["lexical_length"])
        self.section_count[section] += 1
        self.section_length[section] += length
        self.slot_of[key] = slot
        self.key_of[slot] = key
        self.record_slots.setdefault(key[:2], set()).add(slot)
        self.length[slot] = length
        self.section[slot] = section
        self.klass[slot] = klass

    def _add_postings(self, lexemes: list[str], slots: np.ndarray, tfs: np.ndarray) -> None:
        """Append a batch's postings, grouped by term (one sort), to each term's arrays."""
        if not lexemes:
            return
        vocab: dict[str, int] = {}
        ids = np.fromiter(
            (vocab.setdefault(t, len(vocab)) for t in lexemes), dtype=np.int64, count=len(lexemes)
        )
        order = np.argsort(ids, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(ids, minlength=len(vocab)))])
        slots, tfs = slots[order], tfs[order]
        lengths = _counts(self.length[slots])  # placed before their postings are added
        alive = self.alive
        for term, i in vocab.items():
            span = slice(bounds[i], bounds[i + 1])
            added: Postings = (slots[span], tfs[span], lengths[span])
            old = self.postings.get(term)
            if old is None:
                self.postings[term] = added
            else:
                keep = alive[old[0]]  # the term's dead postings go while it is touched anyway
                grown = (
                    np.concatenate([column[keep], fresh]) for column, fresh in zip(old, added, strict=True)
                )
                self.postings[term] = tuple(grown)  # type: ignore[assignment]
            kept = self.term_bounds.get(term)
            if kept is not None:  # raised by the added postings only: dropped ones can only lower it
                peak = float(_summand(1.0, added[1], added[2], kept[0]).max())
                self.term_bounds[term] = (kept[0], max(kept[1], peak))

    # -- reads -------------------------------------------------------------------------------------

    def corpus(self, sections: tuple[str, ...] | None) -> tuple[int, float, np.ndarray | None]:
        """(chunk count, mean length, section-code mask or None for all) of a section scope."""
        if sections is None:
            n = int(self.section_count.sum())
            total = int(self.section_length.sum())
            return n, (total / n if n else 0.0), None
        mask = np.zeros(len(self.section_count), dtype=bool)
        mask[[self.section_code[s] for s in sections if s in self.section_code]] = True
        n = int(self.section_count[mask].sum())
        total = int(self.section_length[mask].sum())
        return n, (total / n if n else 0.0), mask

    def df(self, term: str, sections: np.ndarray | None) -> int:
        """Live chunks (in the section mask) holding ``term``."""
        key = (term, None if sections is None else sections.tobytes())
        cached = self.df_cache.get(key)
        if cached is not None:
            return cached
        posting = self.postings.get(term)
        count = 0
        if posting is not None:
            live = self.alive[posting[0]]
            if sections is not None:
                live &= sections[self.section[posting[0]]]
            count = int(live.sum())
        if len(self.df_cache) >= DF_CACHE_SIZE:
            self.df_cache.clear()
        self.df_cache[key] = count
        return count

    @contextmanager
    def _scratch(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The per-slot marks and sums, sized to the slots; the caller clears what it set, and on an
        error the whole arrays are cleared here."""
        if len(self.scratch_member) < self.size:
            self.scratch_member = _grown(self.scratch_member, self.size)
            self.scratch_total = _grown(self.scratch_total, self.size)
        try:
            yield self.scratch_member, self.scratch_total
        except BaseException:
            self.scratch_member[: self.size] = False
            self.scratch_total[: self.size] = 0.0
            raise

    def _bound(self, term: str, avgdl: float) -> float:
        """An upper bound of ``term``'s summand per unit weight in any chunk, at mean length ``avgdl``.

        The exact maximum over the term's postings is measured at the first search that asks (at
        that search's ``avgdl``) and kept; a write raises it to its added postings' maximum when
        that is higher (a scan of a common word's long list per write would cost more than it
        saves), and postings that die or go only loosen it. The summand ``tf / (tf + c + d / avgdl)``
        grows with ``avgdl`` at most in proportion, so at another mean length the kept maximum scaled
        by ``max(1, avgdl / kept avgdl)`` still bounds it.
        """
        kept = self.term_bounds.get(term)
        if kept is None:
            _, tfs, lengths = self.postings[term]
            peak = float(_summand(1.0, tfs, lengths, avgdl).max()) if len(tfs) else 0.0
            kept = self.term_bounds[term] = (avgdl, peak)
        kept_avgdl, peak = kept
        return peak * max(1.0, avgdl / kept_avgdl)

    def measure_bounds(self, min_postings: int = MAX_SCORE_MIN_POSTINGS // 4) -> None:
        """Measure the bounds of the terms with long lists now, at the partition's mean length (a
        load does, off the event loop): else each one's first search pays a pass over its list."""
        avgdl = max(self.corpus(None)[1], 1.0)  # as bm25_plan floors it
        for term, (slots, *_) in self.postings.items():
            if len(slots) >= min_postings:
                self._bound(term, avgdl)

    def _permitted(self, slots: np.ndarray, known: np.ndarray | None, exclude: np.ndarray) -> np.ndarray:
        """Which of ``slots`` the search may return: live, of a permitted access class, not excluded."""
        ok = self.alive[slots]
        if known is not None:
            ok &= known[self.klass[slots]]
        if len(exclude):
            ok &= ~np.isin(slots, exclude)
        return ok

    def _summand_at(self, term: str, weight: float, avgdl: float, slots: np.ndarray) -> np.ndarray:
        """``term``'s summand at each of ``slots`` (0 where absent), found by binary search
        in its postings: a few slots against a long list."""
        posting, tfs, lengths = self.postings[term]
        out = np.zeros(len(slots))
        if not len(posting):
            return out
        at = np.searchsorted(posting, slots)
        at[at == len(posting)] = 0
        found = posting[at] == slots
        at = at[found]
        out[found] = _summand(weight, tfs[at], lengths[at], avgdl)
        return out

    def _add_marked(
        self, total: np.ndarray, member: np.ndarray, term: str, weight: float, avgdl: float
    ) -> None:
        """Add ``term``'s summand to ``total`` at its postings marked in ``member`` (a scan of the
        term's list; a slot is once in it)."""
        posting, tfs, lengths = self.postings[term]
        hit = member[posting]
        total[posting[hit]] += _summand(weight, tfs[hit], lengths[hit], avgdl)

    def _add_held(self, total: np.ndarray, term: str, weight: float, avgdl: float) -> None:
        """Add ``term``'s summand to ``total`` at its postings whose sum is already positive (the
        candidates, for MaxScore: every summand is positive), by a scan of the term's list."""
        posting, tfs, lengths = self.postings[term]
        held = total[posting]
        hit = held > 0.0
        total[posting[hit]] = held[hit] + _summand(weight, tfs[hit], lengths[hit], avgdl)

    def top(
        self, plan: Bm25Plan, allowed: np.ndarray | None, exclude: Sequence[int], fetch: int
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """The slots and BM25 scores of the ``fetch`` best-scoring permitted chunks of the plan's
        match set (every slot tied with the last one too), and whether that is the whole match set."""
        if not any(t in self.postings for t in plan.selective):
            return np.zeros(0, dtype=np.int32), np.zeros(0), True
        known = None
        if allowed is not None:
            # Classes first seen after the scope was evaluated are not permitted here: their chunks
            # changed after the search's watermark, so the re-read brings them in if they should be.
            known = np.zeros(max(len(self.classes), len(allowed)), dtype=bool)
            known[: len(allowed)] = allowed
        excluded = np.asarray(exclude, dtype=np.int32)
        pruned = self._top_max_score(plan, known, excluded, fetch)
        if pruned is not None:
            return pruned
        return self._top_exhaustive(plan, known, excluded, fetch)

    def _match_set(self, terms: Sequence[str]) -> np.ndarray:
        """The sorted slots holding any of ``terms`` (a match set is sorted only when it is small)."""
        lists = [self.postings[t][0] for t in terms if t in self.postings]
        if len(lists) == 1:
            return lists[0]  # a term's slots are unique and ascending
        if sum(len(slots) for slots in lists) * 16 < self.size:
            return _sorted_unique(np.concatenate(lists))  # small: sort, do not scan every slot
        with self._scratch() as (member, _):
            for slots in lists:
                member[slots] = True
            cand = np.flatnonzero(member[: self.size])
            member[: self.size] = False
        return cand

    def _top_exhaustive(
        self, plan: Bm25Plan, known: np.ndarray | None, exclude: np.ndarray, fetch: int
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """Every permitted chunk of the match set scored, then the best ``fetch`` kept."""
        cand = self._match_set(plan.selective)
        cand = cand[self._permitted(cand, known, exclude)]
        if not len(cand):
            return cand, np.zeros(0), True
        with self._scratch() as (member, total):
            member[cand] = True
            for term, weight in zip(plan.terms, plan.weights, strict=True):
                self._add_marked(total, member, term, weight, plan.avgdl)
            scores = total[cand]
            # Only the match set's slots were touched (ascending: a sequential pass).
            member[cand] = False
            total[cand] = 0.0
        return _best(cand, scores, fetch)

    def _top_max_score(
        self, plan: Bm25Plan, known: np.ndarray | None, exclude: np.ndarray, fetch: int
    ) -> tuple[np.ndarray, np.ndarray, bool] | None:
        """MaxScore, term at a time (Turtle and Flood, 1995): the same answer as scoring every match,
        without scanning what cannot lift a chunk into the top ``fetch``.

        Terms go by falling upper bound (:meth:`_bound`), the selective ones first (only they admit a
        chunk: a match holds one). ``theta``, the ``fetch``-th best sum so far, is a score the final
        cut surely reaches. While the bounds of the terms left sum to ``theta`` or more, a term adds
        every chunk it holds; after that no chunk outside the candidates can make the cut, so a term
        only adds its summand to the candidates, found by binary search in its postings when they are
        few against its list (the long lists of common words), and a candidate whose sum plus the
        bounds left stays under ``theta`` is dropped first. None: too small to be worth it.
        """
        if len(plan.terms) < 2 or sum(len(self.postings[t][0]) for t in plan.terms) < MAX_SCORE_MIN_POSTINGS:
            return None
        selective = set(plan.selective)
        bounds = [w * self._bound(t, plan.avgdl) for t, w in zip(plan.terms, plan.weights, strict=True)]
        order = sorted(range(len(bounds)), key=lambda i: (plan.terms[i] not in selective, -bounds[i]))
        left = np.cumsum([bounds[i] for i in reversed(order)])[::-1]  # left[k]: bounds of order[k:]
        theta, complete = 0.0, True
        # Every permitted: no scope, no exclusion and no dead slot (a fresh load has none).
        everything = known is None and not len(exclude) and self.dead == 0
        cand = np.zeros(0, dtype=np.int32)
        # A slot is a candidate exactly when its sum is positive (every summand is: idf > 0, tf > 0),
        # so the sums are the marks too and a dropped candidate's sum goes back to 0.
        with self._scratch() as (_, total):
            for k, i in enumerate(order):
                term, weight = plan.terms[i], plan.weights[i]
                posting, tfs, lengths = self.postings[term]
                if term in selective and left[k] >= theta:
                    slots, tf, dl = posting, tfs, lengths
                    if not everything:
                        ok = self._permitted(posting, known, exclude)
                        if not ok.all():
                            slots, tf, dl = posting[ok], tfs[ok], lengths[ok]
                    before = total[slots]
                    total[slots] = before + _summand(weight, tf, dl, plan.avgdl)
                    cand = np.concatenate([cand, slots[before == 0.0]])  # in no particular order
                else:
                    complete = complete and term not in selective
                    keep = total[cand] + left[k] >= theta
                    if not keep.all():
                        total[cand[~keep]] = 0.0
                        cand, complete = cand[keep], False
                    if len(cand) * LOOKUP_COST < len(posting):
                        total[cand] += self._summand_at(term, weight, plan.avgdl, cand)
                    else:
                        self._add_held(total, term, weight, plan.avgdl)
                # A new theta can only matter once the sums so far may outgrow the bounds left.
                if len(cand) >= fetch and k + 1 < len(order) and left[0] - left[k + 1] >= left[k + 1]:
                    scores = total[cand]
                    # The k-th best is among those at theta or above if it moved at all.
                    above = scores[scores >= theta] if theta > 0 else scores
                    if len(above) >= fetch:
                        kth = float(np.partition(above, len(above) - fetch)[len(above) - fetch])
                        theta = max(theta, kth * (1 - PRUNE_MARGIN))
            scores = total[cand]
            total[cand] = 0.0
        if theta > 0:
            # theta is under the final fetch-th best sum (partial sums only grow) by more than
            # _best's tie band, so what _best keeps is all at theta or above: a compare here leaves
            # its partial sort the few instead of every candidate (most of a common word's search).
            above = scores >= theta
            if not above.all():
                cand, scores, complete = cand[above], scores[above], False
        slots, scores, whole = _best(cand, scores, fetch)
        return slots, scores, whole and complete


def _summand(weight: float, tfs: np.ndarray, lengths: np.ndarray, avgdl: float) -> np.ndarray:
    """One term's BM25 summand in chunks of ``lengths`` holding it ``tfs`` times: the one formula
    of the index (the SQL leg's :func:`index.search.bm25_score_sql`), in float64."""
    # weight * tf / (tf + k1 * (1 - b + b * length / avgdl)), in place on two arrays: this runs
    # over every posting a search admits, where each temporary is a pass over memory.
    tf = tfs.astype(np.float64)
    out = lengths.astype(np.float64)
    out *= BM25_K1 * BM25_B / avgdl
    out += BM25_K1 * (1 - BM25_B) + tf
    np.divide(tf, out, out=out)
    out *= weight
    return out


def _counts(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """Whole counts (term frequencies, chunk lengths) in the narrowest unsigned type that holds them
    exactly: uint16, or uint32 past 65,535 (a concatenation with a narrower array widens it)."""
    array = np.asarray(values)
    if not len(array):
        return array.astype(np.uint16)
    if array.min() < 0:
        raise ValueError("counts are never negative")
    return array.astype(np.uint16 if array.max() <= np.iinfo(np.uint16).max else np.uint32)


def _best(cand: np.ndarray, scores: np.ndarray, fetch: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """The ``fetch`` best of ``cand`` by ``scores`` with every tie at the cut (the identity order
    decides those in SQL), and whether that is all of ``cand``."""
    if len(cand) <= fetch:
        return cand, scores, True
    kth = scores[np.argpartition(-scores, fetch - 1)[fetch - 1]]
    chosen = scores >= kth - 1e-9 * abs(kth)
    return cand[chosen], scores[chosen], bool(chosen.all())


class LexicalIndex(FeedFollower):
    """Every partition's lexicon, their loading and sync, and the index-served lexical leg."""

    label = "lexical index"
    partitions: dict[str, PartitionLexicon]

    def __init__(
        self,
        pool: asyncpg.Pool,
        database_url: str,
        config: LexicalConfig,
        metrics: LexicalMetrics | None = None,
    ) -> None:
        super().__init__(pool, database_url, config.poll_s)
        self.config = config
        self.metrics = metrics or LexicalMetrics()

    @property
    def enabled(self) -> bool:
        return self.config.mode != "off"

    def _observe(self, lexicon: PartitionLexicon) -> None:
        name = lexicon.partition.partition
        self.metrics.bytes.labels(name).set(lexicon.nbytes)
        self.metrics.chunks.labels(name).set(lexicon.live)

    async def load(self, partition: ModelPartition) -> PartitionLexicon:
        """Build a partition's lexicon from the store (keyset batches), from scratch: also the rebuild."""
        name = partition.partition
        start = time.perf_counter()
        lexicon = PartitionLexicon(partition, scopes=Lru(self.config.scope_cache_size))
        self.partitions[name] = lexicon
        self._set_state(lexicon, "loading")
        async with self.pool.acquire() as conn:
            # The watermark is read before any row: whatever commits during the load is re-applied after.
            watermark = await current_watermark(conn, partition)
            after: RowKey | None = None
            while True:
                rows = await self._batch(conn, partition, after)
                if not rows:
                    break
                # Nothing searches a loading lexicon: its build may leave the event loop.
                await asyncio.to_thread(lexicon.apply, rows)
                after = row_key(rows[-1])
                if len(rows) < self.config.load_batch:
                    break
        await asyncio.to_thread(lexicon.measure_bounds)
        lexicon.watermark = watermark
        lexicon.load_seconds = time.perf_counter() - start
        self._set_state(lexicon, "ready")
        self._observe(lexicon)
        self.metrics.load_seconds.labels(name).set(lexicon.load_seconds)
        log.info(
            "lexical index: %s ready, %d chunks, %d postings, %.1f MiB, loaded in %.2fs",
            name,
            lexicon.live,
            lexicon.posting_count,
            lexicon.nbytes / 2**20,
            lexicon.load_seconds,
        )
        self.notify(partition.model)  # what was written during the load is applied by the follower
        return lexicon

    async def _batch(
        self, conn: asyncpg.Connection, partition: ModelPartition, after: RowKey | None
    ) -> list[asyncpg.Record]:
        cols = ", ".join("e." + c for c in KEY_COLUMNS)
        where = "e.modality = 'text'"
        args: list[object] = []
        if after is not None:
            marks = ", ".join(f"${i + 2}" for i in range(len(after)))
            where += f" AND (e.model, {cols}) > ($1, {marks})"
            args = [partition.model, *after]
        return await conn.fetch(
            f"""SELECT {cols}, {LEXICAL_ROW_COLUMNS} FROM {partition.table} e WHERE {where}
                ORDER BY e.model, {cols} LIMIT {int(self.config.load_batch)}""",
            *args,
        )

    async def sync(self, models: Iterable[str] | None = None) -> int:
        """Apply every change after each ready partition's watermark; returns the keys applied.

        A model first seen after start is loaded.
        """
        wanted = None if models is None else set(models)
        if wanted is not None:
            await self._load_new(wanted)
        applied = 0
        for lexicon in list(self.partitions.values()):
            if lexicon.state == "ready" and (wanted is None or lexicon.partition.model in wanted):
                applied += await self._sync_partition(lexicon)
        if not self._dirty:
            self._lag_since = None
        return applied

    async def _sync_partition(self, lexicon: PartitionLexicon) -> int:
        async with lexicon.lock:
            async with self.pool.acquire() as conn:
                rows, watermark, lags = await changed_rows(
                    conn, lexicon.partition, lexicon.watermark, LEXICAL_ROW_COLUMNS
                )
            upserts, deletes = lexicon.apply(rows)
            lexicon.watermark = watermark
        for lag in lags:
            self.metrics.apply_lag.observe(lag)
        self.metrics.changes.labels("upsert").inc(upserts)
        self.metrics.changes.labels("delete").inc(deletes)
        self._observe(lexicon)
        return len(rows)

    def status(self) -> dict[str, object]:
        """The /readyz detail: mode, feed connection, per-partition state and size."""
        return {
            "mode": self.config.mode,
            "running": self.enabled,
            "listening": bool(self.listener and self.listener.connected),
            "partitions": {
                name: {"state": lx.state, "chunks": lx.live, "postings": lx.posting_count, "bytes": lx.nbytes}
                for name, lx in self.partitions.items()
            },
        }

    # -- scopes ------------------------------------------------------------------------------------

    async def _allowed(
        self, conn: asyncpg.Connection, lexicon: PartitionLexicon, scope: Scope
    ) -> np.ndarray | None:
        """Which access classes the scope (without its excluded record) permits; None: all.

        The legs' own WHERE clause, run over the classes instead of the chunks; a class's attributes
        never change, so a scope's answers are kept and only classes new since are evaluated.
        """
        scope = replace(scope, exclude_record=None)
        if scope == Scope():
            return None
        key = scope_key(scope)
        known = lexicon.scopes.get(key)
        have = 0 if known is None else len(known)
        upto = len(lexicon.classes)
        if known is None or have < upto:
            ids = await permitted_classes(conn, lexicon.classes[have:upto], scope, have)
            grown = np.zeros(upto, dtype=bool)
            if known is not None:
                grown[:have] = known
            grown[ids] = True
            known = grown
        lexicon.scopes.put(key, known)
        return known

    # -- search ------------------------------------------------------------------------------------

    def ready(self, partition: ModelPartition) -> PartitionLexicon | None:
        lexicon = self.partitions.get(partition.partition)
        return lexicon if lexicon is not None and lexicon.state == "ready" else None

    async def plan(
        self,
        conn: asyncpg.Connection,
        lexicon: PartitionLexicon,
        query: str,
        sections: tuple[str, ...] | None,
    ) -> Bm25Plan | None:
        """The query's BM25 plan under the lexicon's exact statistics for the section scope."""
        terms = scored_terms(await query_terms(conn, query))
        if not terms:
            return None
        n, avgdl, mask = lexicon.corpus(None if sections is None else tuple(sorted(set(sections))))
        df = {t: lexicon.df(t, mask) for t in terms}
        idf = {t: bm25_idf(n, d) for t, d in df.items() if d > 0}
        return bm25_plan(terms, idf, df, n, avgdl)

    async def search(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        query: str,
        scope: Scope,
        limit: int,
        *,
        modality: str = "text",
    ) -> list[ChunkHit] | None:
        """The lexical top-``limit`` for ``scope`` (scores as the SQL leg's), or None: use the SQL leg."""
        if not self.enabled:
            return None
        if modality != "text":
            self.metrics.searches.labels("image").inc()
            return None
        lexicon = self.partitions.get(partition.partition)
        if lexicon is None or lexicon.state != "ready":
            self.metrics.searches.labels("failed" if lexicon and lexicon.state == "failed" else "cold").inc()
            return None
        watermark = lexicon.watermark  # captured first: every key changed after it is re-read
        plan = await self.plan(conn, lexicon, query, scope.section_tipos)
        if plan is None:
            self.metrics.searches.labels("hit").inc()
            return []
        allowed = await self._allowed(conn, lexicon, scope)
        excluded = list(lexicon.record_slots.get(scope.exclude_record, ())) if scope.exclude_record else []
        fetch = limit + 8
        while True:
            slots, scores, whole = lexicon.top(plan, allowed, excluded, fetch)
            keys = [lexicon.key_of[s] for s in slots]  # live slots: no await since top()
            rows, trusted = await self.reread(conn, partition, plan, scope, keys, scores, watermark)
            # Exact when the trusted (unchanged since the watermark) candidates cover the top-k, or
            # when the index gave its whole match set.
            if trusted >= limit or whole:
                self.metrics.searches.labels("hit").inc()
                return [chunk_from_row(r, float(r["score"])) for r in rows[:limit]]
            if fetch >= self.config.max_fetch_factor * limit:
                self.metrics.searches.labels("fallback").inc()
                log.info("lexical index: too many pending changes among the candidates; the SQL leg serves")
                return None
            fetch *= 4

    async def reread(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        plan: Bm25Plan,
        scope: Scope,
        keys: Sequence[RowKey],
        scores: np.ndarray,
        watermark: Watermark,
    ) -> tuple[list[asyncpg.Record], int]:
        """The candidates plus every key changed after the watermark, through the scope's SQL filter
        and the plan's match set, in the SQL leg's order; with the number of candidates that had not
        changed. A candidate keeps the index's score (the same BM25 over the same row); a changed
        key is scored by the SQL leg's own expression."""
        where, params = scope_where(scope, [plan.terms, plan.weights, plan.tsquery, plan.avgdl])
        ctes, source = candidates_sql(len(params) + 1, partition.table, scored=True)
        query = f"""
            WITH {ctes}
            SELECT {hit_columns()}, k.cached AND NOT k.pending AS trusted,
                   CASE WHEN k.pending OR k.cand_score IS NULL
                        THEN ({bm25_score_sql("$1", "$2", "$4")}) ELSE k.cand_score END AS score
            FROM {source}
            WHERE {where} AND e.lexical @@ $3::tsquery
            ORDER BY score DESC, {identity_order()}"""
        # Planned with its values every time: a generic plan (PostgreSQL's choice after five runs of
        # one prepared statement) of an earlier join could not see how few keys it joins (16 ms
        # against 0.8 on 20k chunks). The keys' lookups (candidates_sql) now leave that join no
        # other plan; a generic plan of the rest is not measured, so the read pool's sessions and
        # CUSTOM_PLANS keep custom plans.
        rows = await fetch_with_local_settings(
            conn,
            CUSTOM_PLANS,
            query,
            [*params, *candidates_params(keys, partition.model, watermark, scores.tolist())],
        )
        return rows, sum(1 for r in rows if r["trusted"])
