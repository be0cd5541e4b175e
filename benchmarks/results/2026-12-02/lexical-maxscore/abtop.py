"""A/B of PartitionLexicon.top(): the previous commit's (3696ef8, every match scored) against the
tree's (MaxScore), one process, same lexicon and plans, interleaved per query with the order
alternating. Run from the repository root: python abtop.py CHUNKS [REPS]

Corpus: CHUNKS chunks of 5-59 tokens drawn Zipf (s = 1) from a 200k-word vocabulary (term
frequencies from repeats), 100 access classes. Plans as bm25_plan makes them: idf weights, terms
in over half the chunks scored but not selective. Queries: rare (1-3 words of rank over 3000),
common (2-5 words of rank 5-300), mixed (2-12 words of Pareto(0.6) rank: stopwords and rare words
together, as typed questions are). Scope: all, and 1% of the access classes. fetch 48.
"""

import random
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, ".")
from index.bm25 import bm25_idf, bm25_plan
from index.lexical_index import PartitionLexicon
from index.partitions import ModelPartition

# The previous top() and _scratch(), verbatim from git, under other names and scratch arrays.
old_src = subprocess.run(
    ["git", "show", "3696ef8:index/lexical_index.py"], capture_output=True, text=True, check=True
).stdout
body = old_src[
    old_src.index("    def _scratch(self) -> tuple") : old_src.index("class LexicalIndex(FeedFollower):")
]
body = body.replace("def _scratch(", "def _old_scratch(").replace("self._scratch()", "self._old_scratch()")
body = (
    body.replace("def top(", "def _old_top(")
    .replace("scratch_member", "old_scratch_member")
    .replace("scratch_total", "old_scratch_total")
)
ns = {}
exec(
    "from __future__ import annotations\nfrom collections.abc import Sequence\nimport numpy as np\n"
    "from index.lexical_index import _grown, _sorted_unique\nfrom index.bm25 import BM25_B, BM25_K1, Bm25Plan\n"
    "class Old:\n" + body,
    ns,
)
PartitionLexicon._old_scratch = ns["Old"]._old_scratch
PartitionLexicon._old_top = ns["Old"]._old_top


def build(n, vocab=200_000, seed=0):
    rng = np.random.default_rng(seed)
    p = 1 / np.arange(1, vocab + 1)
    p /= p.sum()
    lens = rng.integers(5, 60, size=n)
    doc = np.repeat(np.arange(n, dtype=np.int64), lens)
    term = rng.choice(vocab, size=len(doc), p=p)
    key, cnt = np.unique(doc * vocab + term, return_counts=True)
    d, t = key // vocab, key % vocab
    order = np.argsort(t, kind="stable")
    d, t, cnt = d[order], t[order], cnt[order]
    cut = np.flatnonzero(np.diff(t)) + 1
    lx = PartitionLexicon(ModelPartition("m", 4, "vector", "t"))
    lx.size = n
    lx.alive = np.ones(n, dtype=bool)
    lx.length = np.bincount(d, weights=cnt, minlength=n).astype(np.float64)
    lx.section = np.zeros(n, dtype=np.int32)
    lx.klass = (np.arange(n) % 100).astype(np.int32)
    lx.classes = [None] * 100
    lx.old_scratch_member = np.zeros(0, dtype=bool)
    lx.old_scratch_total = np.zeros(0)
    for s, e in zip(np.concatenate([[0], cut]), np.concatenate([cut, [len(t)]]), strict=True):
        lx.postings[f"w{t[s]}"] = (d[s:e].astype(np.int32), cnt[s:e].astype(np.float32))
    return lx


def plan_of(lx, words, n, avgdl):
    """The search's own plan (bm25_plan) of each word once (every chunk is live here)."""
    df = {w: len(lx.postings[w][0]) for w in dict.fromkeys(words) if w in lx.postings}
    return bm25_plan(dict.fromkeys(df, 1), {w: bm25_idf(n, d) for w, d in df.items()}, df, n, avgdl)


def assert_same_answer(a, b):
    """Two top() answers hold the same slots, with scores equal within rounding."""
    sa = dict(zip(a[0].tolist(), a[1].tolist(), strict=True))
    sb = dict(zip(b[0].tolist(), b[1].tolist(), strict=True))
    assert sa.keys() == sb.keys() and all(abs(sa[k] - sb[k]) <= 1e-12 * sa[k] for k in sa)


def query_kinds(seed=1):
    """100 queries (word lists) of each kind: rare, common, mixed (see the module's docstring)."""
    r = random.Random(seed)
    return {
        "rare": [[f"w{r.randrange(3000, 200000)}" for _ in range(r.randint(1, 3))] for _ in range(100)],
        "common": [[f"w{r.randrange(5, 300)}" for _ in range(r.randint(2, 5))] for _ in range(100)],
        "mixed": [[f"w{int(r.paretovariate(0.6))}" for _ in range(r.randint(2, 12))] for _ in range(100)],
    }


if __name__ == "__main__":
    n = int(sys.argv[1])
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    lx = build(n)
    avgdl = float(lx.length.mean())
    print(f"{n} chunks, {len(lx.postings)} terms, {lx.posting_count} postings", flush=True)
    kinds = query_kinds()
    one_pct = np.zeros(100, dtype=bool)
    one_pct[0] = True
    for pl in (plan_of(lx, w, n, avgdl) for ws in kinds.values() for w in ws):
        if pl:
            lx.top(pl, None, [], 48)  # each term's bound measured once, as after a write in service
    print(
        "| chunks | queries | scope | previous p50 | MaxScore p50 | MaxScore / previous per query, median (IQR) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for kind, words in kinds.items():
        plans = [p for p in (plan_of(lx, w, n, avgdl) for w in words) if p]
        for scope, allowed in (("all", None), ("1%", one_pct)):
            old_t, new_t, ratios = [], [], []
            for rep in range(reps):
                for pl in plans:
                    took = {}
                    for name in ("old", "new") if rep % 2 == 0 else ("new", "old"):
                        fn = lx._old_top if name == "old" else lx.top
                        t0 = time.perf_counter()
                        res = fn(pl, allowed, [], 48)
                        took[name] = time.perf_counter() - t0
                        took[name + "_res"] = res
                    if rep == 0:  # same answer: slots, and scores within rounding
                        assert_same_answer(took["old_res"], took["new_res"])
                    old_t.append(took["old"])
                    new_t.append(took["new"])
                    ratios.append(took["new"] / took["old"])
            q = np.percentile(ratios, [25, 50, 75])
            print(
                f"| {n:,} | {kind} | {scope} | {np.median(old_t) * 1e3:.3f} ms | {np.median(new_t) * 1e3:.3f} ms | "
                f"{q[1]:.3f} ({q[0]:.3f}-{q[2]:.3f}) |",
                flush=True,
            )
    print("same answers on every query (first repetition)")
