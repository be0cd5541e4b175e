"""benchmarks.lexical.measure_lexical (the scale suite's lexical cells: the index leg, its in-memory
core, Tantivy BM25 and the SQL leg over the same chunks and queries) on a kept 1M-chunk store built
by benchmarks.lexical.populate(build_corpus(1_000_000)). Usage, from the repository root:
python measure_kept_store.py URL TEXTS.pkl OUT.json (TEXTS.pkl: the pickled build_corpus list)."""

import asyncio
import json
import pickle
import sys
from pathlib import Path

sys.path.insert(0, ".")
from benchmarks.gateway import gateway_read_pool
from benchmarks.lexical import MODEL, measure_lexical
from index.partitions import get_partition


async def measure(url: str, texts: list[str]) -> dict:
    pool = await gateway_read_pool(url)
    partition = await get_partition(pool, MODEL)
    result = await measure_lexical(pool, url, partition, texts, 499.0, 60, 20)  # the store took 499 s
    await pool.close()
    return result


def main(url: str, texts_path: str, out: str) -> None:
    result = asyncio.run(measure(url, pickle.loads(Path(texts_path).read_bytes())))
    Path(out).write_text(json.dumps(result, indent=1))
    lat = result["latency"]
    for leg in ("index", "index core", "tantivy", "sql"):
        print(leg, {k: round(v["p50_ms"], 3) for k, v in lat[leg].items()})
    core, tantivy = lat["index core"]["all"]["p50_ms"], lat["tantivy"]["all"]["p50_ms"]
    print(f"core/tantivy {core / tantivy:.2f}, whole/tantivy {lat['index']['all']['p50_ms'] / tantivy:.2f}")


main(*sys.argv[1:4])
