"""1-item /embed requests at concurrency 16 for 60 s against a bench sidecar whose MiniLM has
``coalesce_in_flight`` = ``IN_FLIGHT`` (unset: the default, two per replica); prints items/s.

Run from the repository root: ``.venv/bin/python benchmarks/results/2026-12-03/sidecar-in-flight/in_flight.py 1``.
"""

import asyncio
import dataclasses
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path.cwd()))

import benchmarks.stack as bench_stack
from benchmarks.gateway import load_sentences

SECONDS = 60.0
CONCURRENCY = 16
_config = bench_stack.bench_sidecar_config


def _with_in_flight(models_dir: Path | None = None):
    config = _config(models_dir)
    k = sys.argv[1] if len(sys.argv) > 1 else None
    if k:
        models = [
            dataclasses.replace(m, coalesce_in_flight=int(k)) if m.id == bench_stack.BENCH_MODEL else m
            for m in config.models
        ]
        config = dataclasses.replace(config, models=models)
    return config


async def _load(url: str) -> float:
    texts = load_sentences(2000)
    served = 0
    async with aiohttp.ClientSession() as http:

        async def caller(k: int) -> None:
            nonlocal served
            i, end = k, time.perf_counter() + SECONDS
            while time.perf_counter() < end:
                body = {"model": bench_stack.BENCH_MODEL, "input": [texts[i % len(texts)]], "truncate": True}
                async with http.post(url + "/embed", json=body) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"/embed answered {r.status}")
                served += 1
                i += CONCURRENCY

        started = time.perf_counter()
        await asyncio.gather(*(caller(k) for k in range(CONCURRENCY)))
        return served / (time.perf_counter() - started)


if __name__ == "__main__":
    bench_stack.bench_sidecar_config = _with_in_flight
    with bench_stack.open_stack(Path(".mnemo/bench"), database=False, sidecar=True) as stack:
        assert stack.sidecar_url is not None
        print(
            f"in flight {sys.argv[1] if len(sys.argv) > 1 else 'default'}: {asyncio.run(_load(stack.sidecar_url)):.1f} items/s"
        )
