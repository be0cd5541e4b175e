"""One lever of the gateway's own cost, A/B in one run: the gateway suite's levers section
(``gateway.levers``). Every variant is a ``mnemo gateway`` over the suite's largest store, up at the
same time, its windows interleaved with the others' and the legs' SQL (A B SQL, then SQL B A, ...),
so a drift of the shared machine falls on all alike; a lever worth 10% drowns in the drift between two
runs. A variant is ``NAME=VAR=VALUE[+VAR=VALUE]``, or ``NAME=@TREE[+...]`` to run that gateway from
another source tree (a git worktree of the commit before a change), the database, sidecar and caller
staying this tree's.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .measure import alternating_passes, closed_loop, ratio, spread
from .report import Table

__all__ = ["Variant", "levers_table", "parse_variant", "run_levers"]

VARIANT_FORM = "NAME=VAR=VALUE[+VAR=VALUE] or NAME=@TREE[+VAR=VALUE]"


@dataclass(frozen=True)
class Variant:
    """One gateway of the A/B: the settings it adds to the environment, and the source tree it runs
    from (None: this one)."""

    env: dict[str, str] = field(default_factory=dict)
    source: Path | None = None

    def describe(self) -> dict[str, Any]:
        return {"env": self.env, "source": str(self.source) if self.source else None}


def parse_variant(raw: str) -> tuple[str, Variant]:
    """A ``gateway.levers`` entry: a name, then ``@TREE`` (a source tree holding ``gateway/cli.py``)
    and/or ``VAR=VALUE`` settings, joined by ``+``; at least one of them. Anything else is a
    ValueError naming the form."""
    name, _, spec = raw.partition("=")
    env: dict[str, str] = {}
    source: Path | None = None
    for item in filter(None, spec.split("+")):
        if item.startswith("@"):
            source = Path(item[1:]).expanduser().resolve()
            if not (source / "gateway" / "cli.py").is_file():
                raise ValueError(f"gateway.levers {name}: {source} holds no gateway/cli.py")
        elif "=" in item:
            var, _, value = item.partition("=")
            env[var] = value
        else:
            raise ValueError(f"gateway.levers: {VARIANT_FORM}, not {raw!r}")
    if not name or not (env or source):
        raise ValueError(f"gateway.levers: {VARIANT_FORM}, not {raw!r}")
    return name, Variant(env, source)


async def run_levers(
    stack: Any, url: str, pool: Any, partition: Any, queries: tuple[Sequence[str], Any], specs: Sequence[str],
    caller: Callable[..., Any], window: Callable[..., Awaitable[dict[str, float]]],
    *, concurrency: Sequence[int], pairs: int, seconds: float, requests: int,
) -> dict[str, Any]:  # fmt: skip
    """Every variant of ``specs`` over the store at ``url`` (``pool`` and ``partition`` its legs'
    SQL), at each caller count of ``concurrency``, in ``pairs`` alternating passes; ``caller`` and
    ``window``: the gateway suite's (:class:`benchmarks.suite_gateway.GatewayCaller`, its window)."""
    import secrets

    import aiohttp

    from gateway.access.auth import issue_token
    from index.store.hits import Scope

    from .gateway import gateway_process
    from .stack import BENCH_MODEL

    variants = dict(parse_variant(spec) for spec in specs)
    secret = secrets.token_urlsafe(48)
    token = issue_token(secret=secret, sub="bench-admin", projects=None, admin=True)
    async with contextlib.AsyncExitStack() as exits:
        http = await exits.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * max(concurrency)))
        )
        callers: dict[str, Any] = {}
        for name, variant in variants.items():
            gateway = await exits.enter_async_context(
                gateway_process(url, stack.sidecar_url, secret, stack.work_dir / f"levers-{len(callers)}.log",
                                text_model=BENCH_MODEL, source=variant.source,
                                **{"RAG_FAISS_CACHE": "off", **variant.env})
            )  # fmt: skip
            callers[name] = caller(http, gateway, token, pool, partition, Scope(), queries)
            await callers[name].warm()
        sql = next(iter(callers.values())).raw
        points = []
        for c in concurrency:

            async def run(call: Any, c: int = c) -> Any:
                return await closed_loop(call, concurrency=c, requests=requests, max_seconds=seconds)

            paths: dict[str, Callable[[], Awaitable[dict[str, float]]]] = {
                name: functools.partial(window, callers[name], run) for name in callers
            }
            paths["sql"] = functools.partial(_sql_window, run, sql)
            windows = await alternating_passes(paths, pairs)  # A B SQL, then SQL B A, ...
            points.append({"concurrency": c, **_summarize(windows, list(callers))})
    return {
        "variants": {name: v.describe() for name, v in variants.items()},
        "pairs": pairs,
        "points": points,
    }


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
                figures[f"{key}_vs_{base}"] = ratio(figures[key], out["by_variant"][base][key])
                figures[f"{key}_vs_{base}_spread"] = spread(
                    [ratio(w[name][key], w[base][key]) for w in windows]
                )
        out["by_variant"][name] = figures
    return out


def levers_table(result: dict[str, Any], chunks: int) -> Table:
    """Each variant per caller count: p50, req/s, CPU per request, p50 over the legs' SQL, and its
    ratios to the first variant with the pairs' spread."""
    base = next(iter(result["variants"]))
    rows = []
    for point in result["points"]:
        for name, f in point["by_variant"].items():
            ratios = [
                f"{f[f'{k}_vs_{base}']:.3f} ({f[f'{k}_vs_{base}_spread'][0]:.2f}-{f[f'{k}_vs_{base}_spread'][1]:.2f})"
                if f"{k}_vs_{base}" in f else ""
                for k in ("p50", "rps", "cpu_ms")
            ]  # fmt: skip
            rows.append(
                [
                    point["concurrency"],
                    name,
                    f["p50"],
                    f["rps"],
                    f.get("cpu_ms"),
                    f.get("p50_over_sql"),
                    *ratios,
                ]
            )
    title = (f"Levers A/B ({chunks:,} chunks, {result['pairs']} interleaved passes per point; ratios to "
             f"{base!r}, spread the passes' min-max)")  # fmt: skip
    columns = ["callers", "variant", "p50 ms", "req/s", "CPU ms/req", "p50 / legs' SQL", "p50 ratio", "req/s ratio",
               "CPU/req ratio"]  # fmt: skip
    return Table(title, columns, rows)
