"""Gateway workers: ``mnemo gateway --workers 2`` against one process on one store, the retrieval
section's cell at its largest size (issue 44's bar: 1.3x at 32 callers). Windows of a raw keep-alive
client (:func:`benchmarks.flood_client.closed_loop_searches`: a write and a read per search, so the
client leaves the cores to the gateways) alternate between the two, so a slow spell of the shared
machine falls on both alike; each window says where the cores went.
"""

from __future__ import annotations

import os
import secrets
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from .flood import warm
from .flood_client import closed_loop_searches
from .gateway import gateway_process
from .measure import alternating_passes, cores_used, cpu_by_process, spread

__all__ = ["process_groups", "workers_ab"]


async def workers_ab(
    database_url: str, sidecar_url: str, model: str, queries: Sequence[str], workdir: Path, env: Mapping[str, str],
    *, callers: int, passes: int, window_s: float, workers: int = 2, limit: int = 10,
) -> dict[str, Any]:  # fmt: skip
    """One gateway process and one of ``workers`` workers (both with ``env``) on the store at
    ``database_url``: their requests/s, p50 and cores per window, alternating ``passes`` times."""
    from gateway.access.auth import issue_token

    secret = secrets.token_urlsafe(48)
    bearer = issue_token(secret=secret, sub="bench", projects=None, admin=True)
    names = ("1 worker", f"{workers} workers")
    async with (
        gateway_process(database_url, sidecar_url, secret, workdir / "workers-1.log", text_model=model, **env) as one,
        gateway_process(database_url, sidecar_url, secret, workdir / f"workers-{workers}.log", text_model=model,
                        **{**env, "RAG_GATEWAY_WORKERS": str(workers)}) as many,
    ):  # fmt: skip
        urls = dict(zip(names, (one.url, many.url), strict=True))
        for url in urls.values():  # query vectors cached in every worker, pages warm
            await warm(url, bearer, queries)
        group = process_groups(dict(zip(names, (one.process.pid, many.process.pid), strict=True)))

        def window(name: str) -> Any:
            async def run() -> dict[str, Any]:
                before = cpu_by_process()
                result = await closed_loop_searches(urls[name], bearer, queries, callers=callers, seconds=window_s,
                                                    limit=limit)  # fmt: skip
                return {
                    **result.as_dict(),
                    "cores": cores_used(before, cpu_by_process(), result.wall_s, group),
                }

            return run

        runs = await alternating_passes({name: window(name) for name in names}, passes)
    ratios = [run[names[1]]["requests_per_s"] / run[names[0]]["requests_per_s"] for run in runs]
    return {
        "callers": callers, "workers": workers, "window_s": window_s, "passes": runs,
        "throughput_ratio": statistics.median(ratios), "throughput_ratio_spread": spread(ratios),
        "requests_per_s": {n: statistics.median(run[n]["requests_per_s"] for run in runs) for n in names},
        "p50_ms": {n: statistics.median(run[n]["latency_s"]["median"] for run in runs) * 1000 for n in names},
        "cores": {n: _median_cores([run[n]["cores"] for run in runs]) for n in names},
    }  # fmt: skip


def process_groups(gateways: dict[str, int], *, plain: bool = False) -> Any:
    """``group(pid, command line)`` for :func:`benchmarks.measure.cpu_used`: each gateway's process
    tree by name (``gateway (NAME)``, or NAME itself when ``plain``), then ``postgresql``, the
    ``sidecar`` (its Ray processes included), this ``client``, the rest (``other``)."""
    trees = {
        pid: name
        for name, root in gateways.items()
        for pid in [root, *(c.pid for c in psutil.Process(root).children(recursive=True))]
    }
    here = os.getpid()

    def group(pid: int, command: str) -> str:
        if pid in trees:
            return trees[pid] if plain else f"gateway ({trees[pid]})"
        if pid == here:
            return "client" if plain else "client (this benchmark)"
        if "postgres" in command:
            return "postgresql"
        if "sidecar" in command or "ray" in command:
            return "sidecar"
        return "other"

    return group


def _median_cores(windows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each group's median cores over the windows (a group absent from a window used none there)."""
    names = sorted({name for w in windows for name in w})
    return {name: round(statistics.median(w.get(name, 0.0) for w in windows), 2) for name in names}
