"""The HTTP floor: the least a Python HTTP service in front of the legs' SQL costs (the gateway suite).

Issue 27 asks ``semantic_search`` at one caller to stay within 1.3x of the legs' SQL run directly.
Part of any gap is not the gateway's code at all: a request crosses a socket twice, a second process
on the same cores parses HTTP, and its event loop wakes for each. The floor measures that part alone.
It is an aiohttp server, in its own process like the gateway, on the same event loop
(``RAG_UVLOOP``), whose one route runs :class:`benchmarks.gateway.RawLegs` (the legs' SQL as the
gateway runs them, on a read pool like the gateway's) for the query numbered in the body and
answers ``{"ok": true}``: no auth, fusion, gate or hits to serialize.

So, beside the same windows of the gateway and of the SQL, floor/SQL is what the HTTP hop costs
(the part no change to Mnemo's own code can remove while it stays an aiohttp service), and
gateway/floor what Mnemo's code costs over it. Its CPU per request is the least such a process
spends on a search; the gateway's own is judged against it.

Run by the suite as ``python -m benchmarks.cli http-floor --port P --database-url URL --model ID
--dimension D --queries FILE`` (``FILE``: the queries' texts and vectors, :func:`write_queries`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference import eventloop

from .settings import child_environment

__all__ = ["FloorCaller", "FloorProcess", "floor_process", "main", "read_queries", "write_queries"]

ROUTE = "/legs"


def write_queries(path: Path, texts: Sequence[str], vectors: np.ndarray) -> Path:
    """The queries the floor serves, as one ``.npz`` (texts and float32 vectors, same order)."""
    np.savez(path, texts=np.asarray(list(texts), dtype=object), vectors=np.asarray(vectors, np.float32))
    return path


def read_queries(path: Path) -> tuple[list[str], np.ndarray]:
    with np.load(path, allow_pickle=True) as data:
        return [str(t) for t in data["texts"]], np.asarray(data["vectors"], dtype=np.float32)


async def _serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    from index.store.partitions import ensure_partition

    from .gateway import RawLegs, gateway_read_pool

    texts, vectors = read_queries(args.queries)
    pool = await gateway_read_pool(args.database_url)
    partition = await ensure_partition(pool, args.model, args.dimension)
    legs = RawLegs(pool, partition, texts, vectors, args.limit)
    answer = b'{"ok":true}'

    async def search(request: web.Request) -> web.Response:
        body = await request.json()
        await legs.legs(int(body["i"]))
        return web.Response(body=answer, content_type="application/json")

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(body=answer, content_type="application/json")

    app = web.Application()
    app.router.add_post(ROUTE, search)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    try:
        await asyncio.Event().wait()  # until terminated
    finally:
        await runner.cleanup()
        await pool.close()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cli http-floor", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--model", required=True, help="the text model whose partition the legs read")
    parser.add_argument("--dimension", type=int, required=True)
    parser.add_argument("--queries", type=Path, required=True, help="texts and vectors (write_queries)")
    parser.add_argument("--limit", type=int, default=10, help="the search's limit (the legs over-fetch)")
    args = parser.parse_args(argv)
    eventloop.run(_serve(args))
    return 0


@dataclasses.dataclass(frozen=True)
class FloorProcess:
    """A running floor server: its base URL and process id (for its CPU time)."""

    url: str
    pid: int


@contextlib.asynccontextmanager
async def floor_process(
    database_url: str, model: Any, queries: Path, log: Path, *, limit: int = 10
) -> AsyncIterator[FloorProcess]:
    """The floor server in a subprocess on a free loopback port, ready; terminated after."""
    from .processes import serving_subprocess

    argv = ["-m", "benchmarks.cli", "http-floor", "--database-url", database_url, "--model", model.id,
            "--dimension", str(model.dimension), "--queries", str(queries), "--limit", str(limit)]  # fmt: skip
    async with serving_subprocess(argv, log, child_environment(), what="the HTTP floor") as (url, proc):
        yield FloorProcess(url, proc.pid)


class FloorCaller:
    """The floor's path for the suite's load: one POST per search, query ``i``."""

    def __init__(self, http: Any, floor: FloorProcess) -> None:
        self.http, self.url, self.pid = http, floor.url + ROUTE, floor.pid

    async def warm(self, queries: int) -> None:
        """One pass of every query (connections opened, corpus statistics cached), as the gateway's."""
        for i in range(queries):
            await self.legs(i)

    async def legs(self, i: int) -> None:
        async with self.http.post(self.url, json={"i": i}) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"the HTTP floor answered {response.status}")
