"""Cheap HTTP load on loopback: an open-loop flood (pre-built requests pipelined over a few
keep-alive connections) and a closed loop (each caller's next request sent once its last is answered).

Why not aiohttp's client: on a 2-core machine the flooder shares the CPU with the service it floods.
aiohttp's client spends about as much per request as the gateway does answering it, so at ten times
the service's capacity the flooder alone took a core and the figure measured the flooder's CPU, not
the gateway's shedding. A flooder on another host costs the service nothing; this one comes close on
loopback: each request is bytes built once, written on schedule without waiting for the answer
(HTTP/1.1 pipelining, which aiohttp's server answers in order), and each answer is read as a status
line, a ``Content-Length`` and that many bytes. The closed loop (:func:`closed_loop_searches`) costs
the same per request: one write, one read.

``python -m benchmarks.cli flood-client URL TOKEN RATE SECONDS < queries.json`` prints one JSON object:
the requests sent, the rate that was sent, and the statuses (and error codes) that came back.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from .measure import LoadResult, summarize

__all__ = ["closed_loop_searches", "flood", "search_requests"]

CONNECTIONS = 8
_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)
_CODE = re.compile(rb'"code": *"([a-z_.]+)"')


def search_requests(url: str, token: str | None, queries: Sequence[str], limit: int = 10) -> list[bytes]:
    """One ``semantic_search`` request per query, as the bytes sent on the wire (no token: no
    ``Authorization`` header)."""
    parts = urlsplit(url)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    out = []
    for query in queries:
        body = json.dumps(
            {"dd_api": "dd_rag_api", "action": "semantic_search", "options": {"query": query, "limit": limit}}
        ).encode()
        head = (
            f"POST /api/v1/json HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
            f"{auth}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        out.append(head + body)
    return out


async def _answer(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    """One answer: its status (``"200"``, ...) and body, read by its ``Content-Length``."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = _LENGTH.search(head)
    body = await reader.readexactly(int(length.group(1))) if length else b""
    return head[9:12].decode(), body


async def _connection(
    host: str,
    port: int,
    requests: Sequence[bytes],
    rate: float,
    seconds: float,
    offset: float,
    codes: Counter,
) -> int:
    """Send ``rate`` requests/s on one connection for ``seconds`` while reading the answers; the count sent."""
    reader, writer = await asyncio.open_connection(host, port)
    sent = 0
    answered = 0
    owed: int | None = None  # set once sending stops: the reader ends at that many answers

    async def read_answers() -> None:
        nonlocal answered
        while owed is None or answered < owed:
            status, body = await _answer(reader)
            if status != "200":
                code = _CODE.search(body)
                status = f"{status} {code.group(1).decode() if code else ''}".strip()
            codes[status] += 1
            answered += 1

    reading = asyncio.create_task(read_answers())
    started = time.perf_counter()
    try:
        while (now := time.perf_counter() - started) < seconds:
            due = int((now * rate) + offset) - sent  # every request whose time has come
            if due > 0:
                writer.write(b"".join(requests[(sent + j) % len(requests)] for j in range(due)))
                sent += due
            await asyncio.sleep(0.002)
        owed = sent  # the answers still owed: a bounded wait, then what never came is counted as lost
        if answered < owed:
            await asyncio.wait_for(asyncio.shield(reading), 30)
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
        pass  # counted below as unanswered
    finally:
        reading.cancel()
        writer.close()
    if answered < sent:
        codes["unanswered"] += sent - answered
    return sent


async def flood(
    url: str, token: str, rate: float, seconds: float, queries: Sequence[str], connections: int = CONNECTIONS
) -> dict[str, Any]:
    """``rate`` searches/s for ``seconds`` over ``connections`` pipelined connections; what came back."""
    parts = urlsplit(url)
    requests = search_requests(url, token, queries)
    codes: Counter = Counter()
    started = time.perf_counter()
    sent = await asyncio.gather(
        *(
            _connection(
                parts.hostname or "127.0.0.1",
                parts.port or 80,
                requests,
                rate / connections,
                seconds,
                k / connections,
                codes,
            )
            for k in range(connections)
        )
    )
    wall = time.perf_counter() - started
    return {"sent": sum(sent), "sent_per_s": sum(sent) / seconds, "wall_s": wall, "codes": dict(codes)}


async def closed_loop_searches(
    url: str,
    token: str | None,
    queries: Sequence[str],
    *,
    callers: int,
    seconds: float,
    requests: int | None = None,
    limit: int = 10,
) -> LoadResult:
    """``callers`` keep-alive connections, each sending its next search once the last is answered,
    until ``seconds`` pass or ``requests`` were sent: a closed loop whose client costs a write and a
    read per search. Anything but a 200 raises (a warm-up, which lets a cold start's retryable
    errors pass, is :func:`benchmarks.flood.warm`)."""
    parts = urlsplit(url)
    wire = search_requests(url, token, queries, limit)
    numbers = itertools.count() if requests is None else iter(range(requests))
    deadline = time.perf_counter() + seconds
    latencies: list[float] = []

    async def caller() -> None:
        reader, writer = await asyncio.open_connection(parts.hostname or "127.0.0.1", parts.port or 80)
        try:
            for i in numbers:
                if time.perf_counter() > deadline:
                    return
                start = time.perf_counter()
                writer.write(wire[i % len(wire)])
                status, body = await _answer(reader)
                if status != "200":
                    raise RuntimeError(f"semantic_search failed: {status} {body[:500]!r}")
                latencies.append(time.perf_counter() - start)
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return LoadResult(callers, len(latencies), 1, time.perf_counter() - started, summarize(latencies))


def main(argv: Sequence[str]) -> int:
    """``python -m benchmarks.cli flood-client URL TOKEN RATE SECONDS < queries.json``."""
    url, token, rate, seconds = argv[0], argv[1], float(argv[2]), float(argv[3])
    queries = json.loads(sys.stdin.read())
    print(json.dumps(asyncio.run(flood(url, token, rate, seconds, queries))))
    return 0
