"""The load grid of the sidecar benchmark (:mod:`benchmarks.sidecar`): closed-loop callers at each
concurrency and request size, every cell bracketed by baseline windows and normalized against them
(:func:`load_grid`, :func:`normalize`, :func:`combine_windows`), over HTTP to a sidecar
(:class:`SidecarCaller`, :func:`http_grid`: shed answers retried as a client would) or straight into
the Ray-free model service.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .measure import closed_loop, descendants_cpu_s, ratio

__all__ = [
    "SHED_RETRIES",
    "Baseline",
    "SidecarCaller",
    "combine_windows",
    "headline_concurrency",
    "http_grid",
    "load_cell",
    "load_grid",
    "normalize",
]


def _slices(texts: Sequence[str], size: int) -> Callable[[int], list[str]]:
    def pick(i: int) -> list[str]:
        start = (i * size) % len(texts)
        return [texts[(start + k) % len(texts)] for k in range(size)]

    return pick


def _cell(mode: str, load, tokens: int, server_cpu_s: float | None = None) -> dict[str, Any]:
    cpu = (
        {}
        if server_cpu_s is None
        else {"server_cpu_ms_per_request": server_cpu_s * 1000 / max(1, load.requests)}
    )
    return cpu | {
        "mode": mode,
        "concurrency": load.concurrency,
        "request_size": load.items_per_request,
        "requests": load.requests,
        "items_per_s": load.items_per_s,
        "tokens_per_s": tokens / load.wall_s,
        "latency_ms": {
            "p50": load.latency.median * 1000,
            "p95": load.latency.p95 * 1000,
            "p99": load.latency.p99 * 1000,
        },
    }


Baseline = Callable[[], "float | dict[str, float]"]


def _as_figures(measured: float | dict[str, float]) -> dict[str, float]:
    """A baseline window's items/s by configuration; a bare number is in-process batch 32's."""
    return dict(measured) if isinstance(measured, dict) else {"inprocess": float(measured)}


def normalize(cell: dict[str, Any], windows: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Set ``cell``'s baselines (the mean of ``windows``, the baseline windows beside it), its ratios,
    and its spread: the ratio to each window alone, min to max, per configuration.

    ``inprocess`` is the goal table's baseline (``baseline_items_per_s``, ``ratio_to_inprocess``); any
    other configuration ``k`` a window measured gets ``k_items_per_s`` and ``ratio_to_k``.
    """
    spread = {}
    for key in windows[0]:
        speeds = [w[key] for w in windows]
        mean = statistics.fmean(speeds)
        cell["baseline_items_per_s" if key == "inprocess" else f"{key}_items_per_s"] = mean
        cell[f"ratio_to_{key}"] = ratio(cell["items_per_s"], mean)
        per_window = [ratio(cell["items_per_s"], s) for s in speeds]
        spread[f"ratio_to_{key}"] = [min(per_window), max(per_window)]
    cell["spread"] = spread
    cell["baseline_windows"] = [dict(w) for w in windows]
    return cell


def combine_windows(windows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One cell measured in several windows (each :func:`normalize`-d by the baselines beside it).

    Throughputs are the windows' means and each ratio is mean over mean; the spread runs over every
    (window, adjacent baseline) ratio, so it shows both the cell's noise and the baselines'. Latency
    percentiles are the median of the windows' (a window's distribution is not kept).
    """
    if len(windows) == 1:
        return dict(windows[0])
    out = dict(windows[0])
    out["requests"] = sum(w["requests"] for w in windows)
    for key in ("items_per_s", "tokens_per_s"):
        out[key] = statistics.fmean(w[key] for w in windows)
    out["latency_ms"] = {
        q: statistics.median(w["latency_ms"][q] for w in windows) for q in windows[0]["latency_ms"]
    }
    if "server_cpu_ms_per_request" in out:
        out["server_cpu_ms_per_request"] = statistics.median(w["server_cpu_ms_per_request"] for w in windows)
    if "shed_answers" in out:
        out["shed_answers"] = sum(w["shed_answers"] for w in windows)
    spread = {}
    for key in windows[0]["spread"]:
        name = key.removeprefix("ratio_to_")
        base = "baseline_items_per_s" if name == "inprocess" else f"{name}_items_per_s"
        out[base] = statistics.fmean(w[base] for w in windows)
        out[key] = ratio(out["items_per_s"], out[base])
        spread[key] = [min(w["spread"][key][0] for w in windows), max(w["spread"][key][1] for w in windows)]
    out["spread"] = spread
    out["baseline_windows"] = [b for w in windows for b in w["baseline_windows"]]
    out["windows"] = [
        {k: w[k] for k in ("items_per_s", "tokens_per_s", "latency_ms", *w["spread"])} for w in windows
    ]
    return out


async def load_cell(
    mode: str,
    call: Callable[[list[str]], Awaitable[int]],
    texts: Sequence[str],
    *,
    concurrency: int,
    size: int,
    seconds: float,
    server_cpu: bool = True,
) -> dict[str, Any]:
    """One closed-loop window: ``concurrency`` callers sending ``size`` texts per request.

    ``server_cpu``: the server runs in this process's child processes (a sidecar this run started,
    or a peer), so their CPU time over the window per request is the server's cost
    (``server_cpu_ms_per_request``); False for the in-process service, which has none apart."""
    pick = _slices(texts, size)
    tokens = 0

    async def one(i: int) -> None:
        nonlocal tokens
        counted = await call(pick(i))  # not `tokens += await ...`: that loses concurrent updates
        tokens += counted

    cpu_before = descendants_cpu_s() if server_cpu else 0.0
    shed_before = call.shed if isinstance(call, SidecarCaller) else 0
    load = await closed_loop(
        one, concurrency=concurrency, requests=10**9, items_per_request=size, max_seconds=seconds
    )
    cell = _cell(mode, load, tokens, descendants_cpu_s() - cpu_before if server_cpu else None)
    if isinstance(call, SidecarCaller):
        cell["shed_answers"] = call.shed - shed_before  # each retried after its Retry-After
    return cell


def headline_concurrency(concurrencies: Sequence[int]) -> int:
    """The concurrency the headlines come from: 16 when measured, else the highest."""
    return 16 if 16 in concurrencies else max(concurrencies)


async def load_grid(
    mode: str,
    call: Callable[[list[str]], Awaitable[int]],
    texts: Sequence[str],
    *,
    baseline: Baseline,
    concurrencies: Sequence[int],
    sizes: Sequence[int],
    seconds: float,
    repeats: int = 1,
    server_cpu: bool = True,
) -> list[dict[str, Any]]:
    """Each request size's cells are bracketed by in-process baseline windows; ratios use their mean.

    The machine is shared, so its speed drifts over a run; baselines measured next to the cells cancel
    most of that drift, where one baseline for the whole run would not. With ``repeats`` > 1 the
    headline concurrency's cell is measured ``repeats`` times, each further window followed by a
    baseline window, and reported as one cell with the spread of its windows' ratios: a ratio whose
    spread crosses its bar needs more windows, and one window's luck decides nothing.
    """
    cells = []
    before = _as_figures(baseline())
    top = headline_concurrency(concurrencies)
    for size in sizes:
        await call(_slices(texts, size)(0))  # warm the path
        group = []
        for concurrency in concurrencies:
            group.append(
                await load_cell(
                    mode,
                    call,
                    texts,
                    concurrency=concurrency,
                    size=size,
                    seconds=seconds,
                    server_cpu=server_cpu,
                )
            )
        after = _as_figures(baseline())
        for cell in group:
            normalize(cell, [before, after])
        before = after
        for i, cell in enumerate(group):
            if cell["concurrency"] != top or repeats <= 1:
                continue
            windows = [cell]
            for _ in range(repeats - 1):
                again = await load_cell(
                    mode, call, texts, concurrency=top, size=size, seconds=seconds, server_cpu=server_cpu
                )
                after = _as_figures(baseline())
                windows.append(normalize(again, [before, after]))
                before = after
            group[i] = combine_windows(windows)
        cells += group
    return cells


async def _service_grid(spec: Any, encoder: Any, texts: Sequence[str], **grid: Any) -> list[dict[str, Any]]:
    from inference.service import ModelService

    service = ModelService(spec, encoder=encoder)
    service.ready = True  # the encoder already ran real forward passes (the baseline)

    async def call(batch: list[str]) -> int:
        return int((await service.embed(batch, truncate=True))["tokens"])

    try:
        return await load_grid("service", call, texts, server_cpu=False, **grid)
    finally:
        await service.close()


# The sidecar's coded shedding, each with Retry-After: 429 overloaded, 503 not_ready.
SHED_STATUSES = frozenset({429, 503})
SHED_RETRIES = 5


class SidecarCaller:
    """``await caller(texts) -> tokens`` against the sidecar's ``/embed`` (base64 vectors) on ``http``.

    A client of a loaded sidecar: a coded shed answer (429 ``overloaded``, 503 ``not_ready``: no
    replica took the call within ``replica_wait_s``) is sent again after its ``Retry-After``, as
    :class:`inference.client.SidecarClient` does, and counted in :attr:`shed`; its wait stays in
    the request's latency. Past :data:`SHED_RETRIES` sheds, or on any other answer than 200, the
    call raises: a sidecar that keeps refusing is a finding, not load.
    """

    def __init__(self, http: Any, url: str, model: str) -> None:
        self.http, self.url, self.model = http, url, model
        self.shed = 0  # shed answers so far (each retried)

    async def __call__(self, batch: list[str]) -> int:
        body = {"model": self.model, "input": batch, "truncate": True, "encoding_format": "base64"}
        sheds = 0
        while True:
            status, answer, retry_after = await self._post(body)
            if status == 200:
                return int(answer["usage"]["tokens"])
            if status not in SHED_STATUSES or sheds == SHED_RETRIES:
                raise RuntimeError(f"sidecar answered {status} (after {sheds} shed answers): {answer}")
            sheds += 1
            self.shed += 1
            await asyncio.sleep(retry_after)

    async def _post(self, body: dict[str, Any]) -> tuple[int, Any, float]:
        """One answer's status, body and Retry-After seconds (1 when it names none)."""
        import aiohttp

        from inference.client import retry_after_seconds

        for attempt in (1, 2):
            try:
                async with self.http.post(f"{self.url}/embed", json=body) as response:
                    answer = await response.json()
                    retry_after = retry_after_seconds(response.headers.get("Retry-After"))
                    return response.status, answer, 1.0 if retry_after is None else retry_after
            except (
                aiohttp.ServerDisconnectedError,
                aiohttp.ClientConnectionResetError,
                aiohttp.ClientOSError,
            ):
                # The server closed a pooled (or, on a loaded machine, a just-opened) connection
                # at its keep-alive timeout before the request reached it ("Cannot write to closing
                # transport", "Can not write request body"): nothing was served, so send it again
                # once, as SidecarClient does.
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


async def http_grid(url: str, model: str, texts: Sequence[str], **grid: Any) -> list[dict[str, Any]]:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
        return await load_grid("sidecar", SidecarCaller(http, url, model), texts, **grid)
