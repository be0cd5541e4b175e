"""A/B of PartitionLexicon.top(): HEAD's (git show REV:index/lexical_index.py) against the tree's,
one process, the same lexicon's arrays, interleaved per query with the order alternating.
Run from the repository root: python abhead.py CHUNKS [REPS] [REV]"""

import importlib.util
import subprocess
import sys
import time
import types

import numpy as np

sys.path.insert(0, ".")
rev = sys.argv[3] if len(sys.argv) > 3 else "HEAD"
src = subprocess.run(
    ["git", "show", f"{rev}:index/lexical_index.py"], capture_output=True, text=True, check=True
).stdout
old = types.ModuleType("index.lexical_index_old")
old.__package__ = "index"
sys.modules[old.__name__] = old
exec(compile(src, "lexical_index_old.py", "exec"), old.__dict__)
spec = importlib.util.spec_from_file_location(
    "abtop", "benchmarks/results/2026-12-02/lexical-maxscore/abtop.py"
)
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)
n = int(sys.argv[1])
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
lx = ab.build(n)
lx.section_count = np.array([n])
lx.section_length = np.array([int(lx.length.sum())])
ox = old.PartitionLexicon(lx.partition)
for k, v in lx.__dict__.items():
    if k not in ("scratch_member", "scratch_total", "dead"):
        setattr(ox, k, v)
ox.scratch_member = np.zeros(0, dtype=bool)
ox.scratch_total = np.zeros(0)
ox.term_bounds = dict(lx.term_bounds)
avgdl = float(lx.length.mean())
kinds = ab.query_kinds()  # the same queries as abtop.py's
one_pct = np.zeros(100, dtype=bool)
one_pct[0] = True
plans = {k: [p for p in (ab.plan_of(lx, w, n, avgdl) for w in ws) if p] for k, ws in kinds.items()}
for ps in plans.values():
    for p in ps:
        lx.top(p, None, [], 48)
        ox.top(p, None, [], 48)
print(f"{n:,} chunks, {lx.posting_count:,} postings; tree vs {rev}")
print("| queries | scope | HEAD p50 | tree p50 | tree / HEAD per query, median (IQR) |")
print("| --- | --- | --- | --- | --- |")
for kind, ps in plans.items():
    for scope, allowed in (("all", None), ("1%", one_pct)):
        a_t, b_t, ratios = [], [], []
        for rep in range(reps):
            for p in ps:
                took, res = {}, {}
                for name in ("old", "new") if rep % 2 == 0 else ("new", "old"):
                    fn = ox.top if name == "old" else lx.top
                    t0 = time.perf_counter()
                    res[name] = fn(p, allowed, [], 48)
                    took[name] = time.perf_counter() - t0
                if rep == 0:
                    ab.assert_same_answer(res["old"], res["new"])
                a_t.append(took["old"])
                b_t.append(took["new"])
                ratios.append(took["new"] / took["old"])
        q = np.percentile(ratios, [25, 50, 75])
        print(
            f"| {kind} | {scope} | {np.median(a_t) * 1e3:.3f} ms | {np.median(b_t) * 1e3:.3f} ms | {q[1]:.3f} ({q[0]:.3f}-{q[2]:.3f}) |",
            flush=True,
        )
print("same answers on every query (first repetition)")
