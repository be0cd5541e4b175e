"""One partition's BM25 postings in memory (:class:`PartitionLexicon`): the arithmetic of the
in-memory lexical index (:mod:`benchmarks.memory_lexical`), the reference baseline the lexical
benchmarks measure the Tantivy engine against. It is no product engine: the gateway's lexical leg is
the SQL leg or the on-disk Tantivy index (``RAG_LEXICAL_INDEX=memory`` was retired).

Each term's postings are three numpy arrays (chunk slot, term frequency, the chunk's length); a
query is a vectorized gather and sum over its terms, with MaxScore skipping what cannot reach the
top k (:meth:`PartitionLexicon._top_max_score`). Corpus statistics (chunk count, mean length,
document frequency) are counted exactly from the live postings, so the scores are the SQL leg's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import asyncpg
import numpy as np

from index.lru import Lru
from index.search.access_classes import AccessClass, access_class
from index.search.bm25 import Bm25Plan, bm25_summand
from index.store.change_feed import RowKey, Watermark, row_key
from index.store.partitions import ModelPartition

__all__ = ["SCOPE_CACHE_SIZE", "PartitionLexicon"]

DF_CACHE_SIZE = 65_536  # (term, section scope) document frequencies kept between writes
# MaxScore top-k (PartitionLexicon._top_max_score): tried when a query's terms hold at least this
# many postings together (below it, scoring every posting costs less than planning what to skip).
MAX_SCORE_MIN_POSTINGS = 4_096
PRUNE_MARGIN = 1e-7  # relative slack on every cut, far above float rounding, far below a score gap
LOOKUP_COST = 16  # a binary search per slot against a scan per posting: the break-even ratio
ScopeKey = Hashable
# What the scope and ACL push-down reads of a chunk besides its key: its access class.
Postings = tuple[np.ndarray, np.ndarray, np.ndarray]  # one term's slots, term frequencies, chunk lengths
SCOPE_CACHE_SIZE = 256  # section scopes' slot masks kept per partition (LexicalConfig's default)


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
    scopes: Lru[ScopeKey, np.ndarray] = field(default_factory=lambda: Lru(SCOPE_CACHE_SIZE))
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
        """Apply rows read with :data:`index.search.access_classes.LEXICAL_ROW_COLUMNS` after their key: each key's old slot dies, a
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
                peak = float(bm25_summand(1.0, added[1], added[2], kept[0]).max())
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
            peak = float(bm25_summand(1.0, tfs, lengths, avgdl).max()) if len(tfs) else 0.0
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
        out[found] = bm25_summand(weight, tfs[at], lengths[at], avgdl)
        return out

    def _add_marked(
        self, total: np.ndarray, member: np.ndarray, term: str, weight: float, avgdl: float
    ) -> None:
        """Add ``term``'s summand to ``total`` at its postings marked in ``member`` (a scan of the
        term's list; a slot is once in it)."""
        posting, tfs, lengths = self.postings[term]
        hit = member[posting]
        total[posting[hit]] += bm25_summand(weight, tfs[hit], lengths[hit], avgdl)

    def _add_held(self, total: np.ndarray, term: str, weight: float, avgdl: float) -> None:
        """Add ``term``'s summand to ``total`` at its postings whose sum is already positive (the
        candidates, for MaxScore: every summand is positive), by a scan of the term's list."""
        posting, tfs, lengths = self.postings[term]
        held = total[posting]
        hit = held > 0.0
        total[posting[hit]] = held[hit] + bm25_summand(weight, tfs[hit], lengths[hit], avgdl)

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
                    total[slots] = before + bm25_summand(weight, tf, dl, plan.avgdl)
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
