"""inference.client: splitting, order, typed errors, retries with Retry-After, on real HTTP servers."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from PIL import Image

from inference.client import (
    SidecarClient,
    SidecarError,
    SidecarOverloaded,
    SidecarRejected,
    SidecarUnavailable,
)
from inference.launcher import free_port

MINILM = "all-minilm-l6-v2"


async def test_large_inputs_are_split_and_reassembled_in_order(sidecar_url: str) -> None:
    texts = [f"record {i}: a {'red ' * (i % 5)}amphora" for i in range(70)]
    async with SidecarClient(sidecar_url, max_batch=32) as client:
        whole = await client.embed(MINILM, texts)
        assert whole.embeddings.shape == (70, 384) and whole.dimension == 384
        pieces = [await client.embed(MINILM, texts[i : i + 7]) for i in range(0, 70, 7)]
        np.testing.assert_allclose(
            whole.embeddings, np.concatenate([p.embeddings for p in pieces]), atol=2e-5
        )
        assert whole.tokens == sum(await client.tokenize(MINILM, texts))

        documents = [f"document {i}" for i in range(40)]
        scores = await client.rerank("tiny-reranker-random", "amphora", documents)
        single = [(await client.rerank("tiny-reranker-random", "amphora", [d]))[0] for d in documents[:3]]
        assert len(scores) == 40 and scores[:3] == pytest.approx(single, abs=1e-6)

        buffer = io.BytesIO()
        Image.new("RGB", (20, 20), (0, 90, 0)).save(buffer, format="JPEG")
        images = await client.embed_images("tiny-siglip-random", [buffer.getvalue()] * 35)
        assert images.embeddings.shape[0] == 35 and images.tokens == 0
        np.testing.assert_allclose(images.embeddings[0], images.embeddings[34], atol=1e-6)


async def test_sparse_rows_come_back_with_integer_ids(sidecar_url: str) -> None:
    async with SidecarClient(sidecar_url) as client:
        result = await client.embed("tiny-bge-m3-random", ["amphora coin", "dam"], return_sparse=True)
        assert result.sparse is not None and len(result.sparse) == 2
        assert all(
            isinstance(k, int) and isinstance(v, float) for row in result.sparse for k, v in row.items()
        )
        dense_only = await client.embed("tiny-bge-m3-random", ["amphora coin"])
        assert dense_only.sparse is None


async def test_bad_input_is_rejected_with_its_code_and_not_retried(sidecar_url: str) -> None:
    async with SidecarClient(sidecar_url) as client:
        with pytest.raises(SidecarRejected) as info:
            await client.embed(MINILM, ["amphora " * 600])
        assert (info.value.status, info.value.code) == (422, "input_too_long")
        with pytest.raises(SidecarRejected) as info:
            await client.embed("no-such-model", ["x"])
        assert (info.value.status, info.value.code) == (404, "model_not_found")
        assert (await client.embed(MINILM, ["amphora " * 600], truncate=True)).embeddings.shape == (1, 384)


class _Scripted:
    """A real HTTP server answering a scripted sequence of statuses (then 200 with one embedding)."""

    def __init__(self, statuses: list[int], retry_after: str = "0") -> None:
        self.statuses = list(statuses)
        self.retry_after = retry_after
        self.calls = 0

    async def handler(self, request: web.Request) -> web.Response:
        self.calls += 1
        if self.statuses:
            status = self.statuses.pop(0)
            body = {"error": {"code": f"code_{status}", "message": "scripted"}}
            return web.json_response(body, status=status, headers={"Retry-After": self.retry_after})
        return web.json_response(
            {"embeddings": [[1.0, 0.0]], "model": "m", "dimension": 2, "usage": {"tokens": 3}}
        )


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[_Scripted, str]]:
    script = _Scripted([])
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", script.handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield script, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_retries_on_503_and_429_then_succeeds(scripted: tuple[_Scripted, str]) -> None:
    script, url = scripted
    script.statuses = [503, 429, 502]
    async with SidecarClient(url, max_retries=3) as client:
        result = await client.embed("m", ["x"])
    assert result.embeddings.tolist() == [[1.0, 0.0]] and result.tokens == 3
    assert script.calls == 4


async def test_overloaded_and_unavailable_after_retries(scripted: tuple[_Scripted, str]) -> None:
    script, url = scripted
    script.statuses = [429] * 3
    async with SidecarClient(url, max_retries=2) as client:
        with pytest.raises(SidecarOverloaded):
            await client.embed("m", ["x"])
    assert script.calls == 3
    script.statuses, script.calls = [503] * 2, 0
    async with SidecarClient(url, max_retries=1) as client:
        with pytest.raises(SidecarUnavailable) as info:
            await client.embed("m", ["x"])
        assert not isinstance(info.value, SidecarOverloaded)
    script.statuses, script.calls = [400], 0
    async with SidecarClient(url, max_retries=3) as client:
        with pytest.raises(SidecarRejected):
            await client.embed("m", ["x"])
    assert script.calls == 1  # never retried
    script.statuses, script.calls = [500], 0
    async with SidecarClient(url, max_retries=3) as client:
        with pytest.raises(SidecarError) as info:
            await client.embed("m", ["x"])
        assert not isinstance(info.value, SidecarUnavailable | SidecarRejected)


async def test_wrong_vector_count_is_an_error(scripted: tuple[_Scripted, str]) -> None:
    _, url = scripted
    async with SidecarClient(url) as client:
        with pytest.raises(SidecarError, match="1 vectors for 2 inputs"):
            await client.embed("m", ["x", "y"])


async def test_unreachable_sidecar_is_unavailable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with SidecarClient(url, max_retries=1, timeout=2) as client:
        assert not await client.ready()
        with pytest.raises(SidecarUnavailable):
            await client.embed(MINILM, ["x"])
