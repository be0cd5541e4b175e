"""One lever of the gateway's own cost, A/B in one run: gateways that differ only by their
environment or by the source tree they run from.

Two runs of the gateway suite minutes apart carry two samples of a shared machine's drift; a lever
worth 10% drowns in it. Here every variant is a ``mnemo gateway`` process over the same database,
up at the same time, and the windows interleave: A B SQL, then SQL B A, and so on, so a drift
linear over a pair falls on all alike. Each pair gives each variant's p50, requests/s and CPU per
request (the gateway process's CPU time over the window, per request served) and the legs' SQL
beside them; the ratios B/A are per pair, printed with their min and max.

``python -m benchmarks.levers --variant 'asyncio loop=RAG_UVLOOP=off' --variant 'uvloop=RAG_UVLOOP=on'``
(those two by default; the first variant is the baseline). A code change is a lever too: a variant
``NAME=@TREE`` (``@TREE,VAR=VALUE`` for both) runs its gateway from another source tree, a git
worktree of the commit before it (``git worktree add /tmp/before HEAD~1``); the database, the
sidecar and the caller stay this tree's. It starts its own embedded PostgreSQL and sidecar, like
``mnemo bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .measure import alternating_passes, closed_loop, ratio

__all__ = ["Variant", "parse_variant", "run_levers"]


@dataclass(frozen=True)
class Variant:
    """One gateway of the A/B: the settings it adds to the environment, and the source tree it runs
    from (None: this one)."""

    env: dict[str, str] = field(default_factory=dict)
    source: Path | None = None

    def describe(self) -> dict[str, Any]:
        return {"env": self.env, "source": str(self.source) if self.source else None}


DEFAULT_VARIANTS = {"asyncio loop": Variant({"RAG_UVLOOP": "off"}), "uvloop": Variant({"RAG_UVLOOP": "on"})}


async def run_levers(
    stack: Any,
    variants: dict[str, Variant],
    *,
    chunks: int = 10_000,
    embedded: int = 400,
    queries: int = 40,
    concurrency: Sequence[int] = (1, 32),
    pairs: int = 4,
    seconds: float = 3.0,
    requests: int = 600,
) -> dict[str, Any]:
    import aiohttp

    from gateway.access.auth import issue_token
    from index.models import resolve_model
    from index.store.hits import Scope
    from inference.client import SidecarClient

    from .gateway import gateway_process, gateway_read_pool, load_corpus, load_queries, load_sentences
    from .stack import BENCH_MODEL
    from .suite_gateway import LIMIT, GatewayCaller, gateway_window

    url = await stack.fresh_database("bench_levers")
    pool = await gateway_read_pool(url)
    secret = secrets.token_urlsafe(48)
    token = issue_token(secret=secret, sub="bench-admin", projects=None, admin=True)
    try:
        async with SidecarClient(stack.sidecar_url, timeout=300) as client:
            model = await resolve_model(client, "text", BENCH_MODEL)
            partition = await load_corpus(pool, client, model, load_sentences(chunks)[:chunks], embedded)
            texts = load_queries(queries)
            vectors = np.asarray(
                (await client.embed(model.id, texts, truncate=True)).embeddings, dtype=np.float32
            )
        async with contextlib.AsyncExitStack() as exits:
            http = await exits.enter_async_context(
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * max(concurrency)))
            )
            callers: dict[str, GatewayCaller] = {}
            for name, variant in variants.items():
                log = stack.work_dir / f"levers-{len(callers)}.log"
                gateway = await exits.enter_async_context(
                    gateway_process(
                        url,
                        stack.sidecar_url,
                        secret,
                        log,
                        text_model=model.id,
                        source=variant.source,
                        **{"RAG_FAISS_CACHE": "off", **variant.env},
                    )
                )
                callers[name] = GatewayCaller(
                    http, gateway, token, pool, partition, Scope(), (texts, vectors)
                )
                await callers[name].warm()
            sql = next(iter(callers.values())).raw
            points = []
            for c in concurrency:

                async def run(call: Any, c: int = c) -> Any:
                    return await closed_loop(call, concurrency=c, requests=requests, max_seconds=seconds)

                paths: dict[str, Callable[[], Awaitable[dict[str, float]]]] = {
                    name: functools.partial(gateway_window, callers[name], run) for name in callers
                }
                paths["sql"] = functools.partial(_sql_window, run, sql)
                windows = await alternating_passes(paths, pairs)  # A B SQL, then SQL B A, ...
                points.append({"concurrency": c, **_summarize(windows, list(callers))})
    finally:
        await pool.close()
    return {"chunks": chunks, "model": model.id, "limit": LIMIT, "pairs": pairs, "seconds": seconds,
            "variants": {name: v.describe() for name, v in variants.items()}, "points": points}  # fmt: skip


async def _sql_window(run: Any, raw: Any) -> dict[str, float]:
    load = await run(raw.legs)
    return {"p50": load.latency.median * 1000, "rps": load.requests_per_s}


def _summarize(windows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    base = names[0]
    out: dict[str, Any] = {"windows": windows, "by_variant": {}}
    for name in [*names, "sql"]:
        cells = [w[name] for w in windows]
        figures = {
            "p50": statistics.median(c["p50"] for c in cells),
            "rps": statistics.fmean(c["rps"] for c in cells),
        }
        if name != "sql":
            figures["cpu_ms"] = statistics.median(c["cpu_ms"] for c in cells)
            figures["p50_over_sql"] = ratio(
                figures["p50"], statistics.median(w["sql"]["p50"] for w in windows)
            )
        if name not in (base, "sql"):
            for key in ("p50", "rps", "cpu_ms"):
                pair_ratios = [ratio(w[name][key], w[base][key]) for w in windows]
                figures[f"{key}_vs_{base}"] = ratio(figures[key], out["by_variant"][base][key])
                figures[f"{key}_vs_{base}_spread"] = (min(pair_ratios), max(pair_ratios))
        out["by_variant"][name] = figures
    return out


def render(result: dict[str, Any]) -> str:
    names = list(result["variants"])
    lines = [
        f"gateway levers, {result['chunks']:,} chunks, {result['pairs']} interleaved pairs of "
        f"{result['seconds']:g} s windows per point; ratios vs {names[0]!r}, spread = pairs' min-max",
        "| callers | variant | p50 ms | req/s | CPU ms/req | p50 / legs' SQL | p50 ratio (spread) | req/s ratio "
        "(spread) | CPU/req ratio (spread) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for point in result["points"]:
        for name, f in point["by_variant"].items():
            cells = [f"{f['p50']:.2f}", f"{f['rps']:.1f}", f"{f['cpu_ms']:.2f}" if "cpu_ms" in f else "",
                     f"{f['p50_over_sql']:.2f}" if "p50_over_sql" in f else ""]  # fmt: skip
            for key in ("p50", "rps", "cpu_ms"):
                lo_hi = f.get(f"{key}_vs_{names[0]}_spread")
                cells.append(
                    f"{f[f'{key}_vs_{names[0]}']:.3f} ({lo_hi[0]:.2f}–{lo_hi[1]:.2f})" if lo_hi else ""
                )
            lines.append(f"| {point['concurrency']} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


VARIANT_FORM = "NAME=[@TREE,]VAR=VALUE[,VAR=VALUE] or NAME=@TREE"


def parse_variant(raw: str) -> tuple[str, Variant]:
    """``--variant``'s value: a name, then ``@TREE`` (a source tree holding ``gateway/cli.py``)
    and/or ``VAR=VALUE`` settings, comma-separated; at least one of them."""
    name, _, spec = raw.partition("=")
    env: dict[str, str] = {}
    source: Path | None = None
    for item in filter(None, spec.split(",")):
        if item.startswith("@"):
            source = Path(item[1:]).expanduser().resolve()
            if not (source / "gateway" / "cli.py").is_file():
                raise argparse.ArgumentTypeError(f"--variant {name}: {source} holds no gateway/cli.py")
        elif "=" in item:
            var, _, value = item.partition("=")
            env[var] = value
        else:
            raise argparse.ArgumentTypeError(f"--variant {VARIANT_FORM}, not {raw!r}")
    if not name or not (env or source):
        raise argparse.ArgumentTypeError(f"--variant {VARIANT_FORM}, not {raw!r}")
    return name, Variant(env, source)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.levers", description=__doc__.splitlines()[0])
    p.add_argument("--variant", type=parse_variant, action="append", help=f"{VARIANT_FORM} (2 or more)")
    p.add_argument("--chunks", type=int, default=10_000)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--concurrency", default="1,32")
    p.add_argument("--work-dir", type=Path, default=Path(".mnemo/bench"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    variants = dict(args.variant) if args.variant else DEFAULT_VARIANTS
    from .stack import open_stack

    started = time.perf_counter()
    with open_stack(args.work_dir, database=True, sidecar=True) as stack:
        result = asyncio.run(
            run_levers(
                stack,
                variants,
                chunks=args.chunks,
                pairs=args.pairs,
                seconds=args.seconds,
                concurrency=tuple(int(c) for c in args.concurrency.split(",")),
            )
        )
    result["wall_s"] = time.perf_counter() - started
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
