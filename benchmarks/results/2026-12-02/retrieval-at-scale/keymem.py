"""The lexicon's kept bytes per chunk (tracemalloc) for 200k chunks of 5-chunk records whose key
strings arrive as separate objects, as the driver decodes them: "shared" (the tree) or "copies"
(each row's own strings). Run from the repository root: python keymem.py shared|copies"""

import sys
import tracemalloc

sys.path.insert(0, ".")
from index.lexical_index import PartitionLexicon
from index.partitions import ModelPartition


class _Row(dict):
    def __getitem__(self, k):
        return self["key"][k] if isinstance(k, int) else dict.__getitem__(self, k)


def fresh(t):
    return "".join(list(t))


n = 200_000


def rows(lo, hi):
    return [
        _Row(
            key=(
                fresh("oh1"),
                i // 5 + 10**6,
                fresh("rag:transcription"),
                fresh("lg-spa"),
                fresh("v"),
                i % 5,
            ),
            lexical_length=3,
            lexemes=["a", "b"],
            tfs=[1, 2],
            projects=[1],
            acl_pairs=None,
            acl_sections=None,
        )
        for i in range(lo, hi)
    ]


shared = sys.argv[1] == "shared"
if not shared:
    PartitionLexicon._shared = lambda self, key: key
lx = PartitionLexicon(ModelPartition("m", 4, "vector", "t"))
tracemalloc.start()
for lo in range(0, n, 10_000):
    lx.apply(rows(lo, lo + 10_000))
cur, peak = tracemalloc.get_traced_memory()
print(f"{sys.argv[1]}: {cur / n:.0f} bytes per chunk kept (5 chunks a record)")
