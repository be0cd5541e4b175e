"""Load held for a bounded time on real services, for the reliability suite.

:func:`sidecar_overload`: the sidecar's capacity for one model is measured (closed loop), then
requests arrive at ``factor`` times that rate (open loop) for ``seconds``. Goals: every answer is a
200 with one vector per input, or load shed as a coded 429/503 with ``Retry-After``; never another
5xx or a dropped connection; the model replicas' RSS stays bounded; normal service afterwards.

:func:`gateway_mixed_load`: ``callers`` closed-loop callers mixing ``semantic_search``, ``retrieve``,
``similar_to`` and intake (``POST /v1/records``) on a gateway; failed requests and p99 per class.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from .fuzz import error_code
from .gateway import api_request
from .measure import closed_loop, percentile

__all__ = ["gateway_mixed_load", "replica_rss_mb", "sidecar_overload"]


def replica_rss_mb(deployment: str) -> float | None:
    """Total RSS (MiB) of this process's Ray workers serving ``deployment``; None when there is none
    here (an external sidecar)."""
    import psutil

    total, found = 0, False
    for proc in psutil.Process().children(recursive=True):
        try:
            if deployment in " ".join(proc.cmdline()):
                total += proc.memory_info().rss
                found = True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return round(total / 2**20, 1) if found else None


def _check_answer(
    status: int, payload: bytes, retry_after: str | None, inputs: int, problems: Counter
) -> None:
    """Count in ``problems`` an answer that breaks the contract: a 200 without one vector per input,
    a 429 or 503 uncoded or without ``Retry-After``."""
    if status == 200:
        if len(json.loads(payload).get("embeddings", [])) != inputs:
            problems["200 without one vector per input"] += 1
    elif status in (429, 503):
        if not (error_code(payload) and retry_after):
            problems[f"{status} uncoded or without Retry-After"] += 1


async def _offer(
    call: Callable[[], Awaitable[Any]], rate: float, seconds: float, max_in_flight: int, timeout_s: float,
    deployment: str, rss_before: float | None,
) -> dict[str, Any]:  # fmt: skip
    """Open-loop load: ``call`` started at ``rate`` per second for ``seconds``, never more than
    ``max_in_flight`` at once (a call over that bound is counted as skipped, not queued), the
    replica's RSS sampled every 0.5 s; then the calls still in flight awaited."""
    rss_max = rss_before
    tasks: set[asyncio.Task] = set()
    sent = skipped = 0
    start = time.perf_counter()
    next_sample = start
    while (now := time.perf_counter()) < start + seconds:
        due = int((now - start) * rate) + 1
        while sent + skipped < due:
            if len(tasks) >= max_in_flight:  # the client's own bound: count it, do not queue
                skipped += 1
                continue
            task = asyncio.create_task(call())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        if now >= next_sample:
            rss = replica_rss_mb(deployment)
            if rss is not None:
                rss_max = max(rss_max or 0.0, rss)
            next_sample = now + 0.5
        await asyncio.sleep(0.002)
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s + 5)
    return {"sent": sent, "skipped": skipped, "held_s": time.perf_counter() - start, "rss_max": rss_max}


async def sidecar_overload(
    sidecar_url: str,
    model: str,
    *,
    seconds: float,
    factor: float = 2.0,
    texts_per_request: int = 16,
    max_in_flight: int = 256,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Hold ``factor`` times the measured capacity for ``seconds`` (see the module's docstring)."""
    import aiohttp

    from inference.serve_app import deployment_name

    deployment = deployment_name(model)
    texts = [
        f"Testimony {i}: the water rose over the village fields at night." for i in range(texts_per_request)
    ]
    body = json.dumps({"model": model, "input": texts}).encode()
    headers = {"Content-Type": "application/json"}
    statuses: Counter = Counter()
    problems = Counter()
    connector = aiohttp.TCPConnector(limit=max_in_flight)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def call(_: int = 0, counted: Counter = statuses) -> str:
            try:
                async with session.post(sidecar_url + "/embed", data=body, headers=headers) as response:
                    payload = await response.read()
                    status = response.status
                    retry_after = response.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError):
                counted["no answer"] += 1
                return "no answer"
            counted[str(status)] += 1
            _check_answer(status, payload, retry_after, len(texts), problems)
            return str(status)

        warm = await closed_loop(call, concurrency=8, requests=10_000, max_seconds=min(2.0, seconds))
        capacity = warm.requests_per_s
        statuses.clear()
        rss_before = replica_rss_mb(deployment)
        rate = factor * capacity
        held = await _offer(call, rate, seconds, max_in_flight, timeout_s, deployment, rss_before)
        sent, skipped, held_s, rss_max = held["sent"], held["skipped"], held["held_s"], held["rss_max"]
        rss_after = replica_rss_mb(deployment)
        served_after = await call(counted=Counter()) == "200"  # normal service again, counted apart
    shed = statuses.get("429", 0) + statuses.get("503", 0)
    server_errors = sum(v for k, v in statuses.items() if k not in ("200", "429", "503"))
    return {
        "model": model,
        "texts_per_request": texts_per_request,
        "capacity_rps": round(capacity, 1),
        "offered_rps": round(rate, 1),
        "held_s": round(held_s, 1),
        "sent": sent,
        "not_sent_client_bound": skipped,
        "statuses": dict(sorted(statuses.items())),
        "served": statuses.get("200", 0),
        "shed": shed,
        "server_errors": server_errors,
        "problems": dict(problems),
        "rss_mb": {"before": rss_before, "max": rss_max, "after": rss_after},
        "served_after": served_after,
    }


MIXED_CLASSES = ("semantic_search", "retrieve", "similar_to", "ingest")


async def _seeds(
    session: Any, url: str, headers: dict[str, str], section_tipo: str, queries: Any
) -> list[int]:
    """Ids of ``section_tipo`` records a search finds now: ``similar_to`` seeds that exist."""
    ids: list[int] = []
    for query in queries:
        payload = api_request("semantic_search", query=query, section_tipo=section_tipo, limit=20)
        async with session.post(url + "/api/v1/json", json=payload, headers=headers) as response:
            rows = (await response.json()).get("data") or []
        ids += [
            r["section_id"]
            for r in rows
            if isinstance(r.get("section_id"), int) and r["section_id"] not in ids
        ]
    if not ids:
        raise RuntimeError(f"no {section_tipo} record found to seed similar_to")
    return ids


async def gateway_mixed_load(
    url: str,
    token: str,
    *,
    callers: int = 64,
    seconds: float,
    section_tipo: str,
    ingest_record: Any,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """``callers`` closed-loop callers, each cycling through :data:`MIXED_CLASSES` from its own
    offset, for ``seconds``. ``similar_to`` seeds are records of ``section_tipo`` that a search finds
    first (so they exist now); ``ingest_record(n)`` gives the n-th record to push (one per request).
    Failed: any answer but 200/202 (429 included), counted by status and error code."""
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"}
    latencies: dict[str, list[float]] = {c: [] for c in MIXED_CLASSES}
    failed: dict[str, Counter] = {c: Counter() for c in MIXED_CLASSES}
    queries = ("reservoir families", "silver coins mill", "amphora chariot", "valley flooded farms")
    pushed = 0
    connector = aiohttp.TCPConnector(limit=callers)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as s:
        section_ids = await _seeds(s, url, headers, section_tipo, queries)
        deadline = time.perf_counter() + seconds

        async def one(klass: str, i: int) -> None:
            nonlocal pushed
            if klass == "ingest":
                pushed += 1
                method, path, payload = "POST", "/v1/records", ingest_record(pushed)
            else:
                options: dict[str, Any] = {"section_tipo": section_tipo, "limit": 10}
                if klass == "similar_to":
                    options["section_id"] = section_ids[i % len(section_ids)]
                else:
                    options["query"] = queries[i % len(queries)]
                method, path = "POST", "/api/v1/json"
                payload = api_request(klass, **options)
            start = time.perf_counter()
            try:
                async with s.request(method, url + path, json=payload, headers=headers) as response:
                    answer = await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError):
                status, answer = 0, b""
            latencies[klass].append(time.perf_counter() - start)
            if status not in (200, 202):
                failed[klass][f"{status} {error_code(answer) or 'uncoded'}" if status else "no answer"] += 1

        async def caller(offset: int) -> None:
            i = offset
            while time.perf_counter() < deadline:
                await one(MIXED_CLASSES[i % len(MIXED_CLASSES)], i)
                i += 1

        await asyncio.gather(*(caller(k) for k in range(callers)))
    return {
        "callers": callers,
        "seconds": seconds,
        "classes": {
            c: {
                "requests": len(latencies[c]),
                "failed": sum(failed[c].values()),
                "failed_by_status": dict(failed[c]),
                "p50_ms": round(percentile(latencies[c], 50) * 1000, 1) if latencies[c] else None,
                "p99_ms": round(percentile(latencies[c], 99) * 1000, 1) if latencies[c] else None,
            }
            for c in MIXED_CLASSES
        },
        "failed": sum(sum(f.values()) for f in failed.values()),
        "records_pushed": pushed,
    }
