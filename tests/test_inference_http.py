"""The sidecar over real HTTP: one test per status, concurrency, batch independence, auth, readiness.

Most tests use the session's Ray Serve sidecar. The states that need a model held in place (not yet
warm, queue full, a forward pass that raises) use the same API on an in-process aiohttp server around
the same model code, so they are deterministic.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import json
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer
from PIL import Image

from inference.api import LocalBackend, SidecarAPI
from inference.client import SidecarClient, SidecarRejected
from inference.config import SidecarConfig
from inference.encoders import Encoder
from inference.errors import ErrorCode
from inference.local_server import create_app, start_front
from inference.net import free_port
from inference.service import ModelService
from tests.fixtures.sidecar import SIDECAR_KEEP_ALIVE_S, bomb_png
from tests.waiting import until

MINILM = "all-minilm-l6-v2"
SIGLIP = "tiny-siglip-random"


def _png(size: tuple[int, int] = (16, 16)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, (120, 30, 30)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _post(
    http: aiohttp.ClientSession, url: str, body: object
) -> tuple[int, dict, aiohttp.typedefs.LooseHeaders]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    # A BytesIO body: aiohttp warns (an error under pytest) about large raw byte bodies.
    kwargs = {"data": io.BytesIO(raw), "headers": {"Content-Type": "application/json"}}
    async with http.post(url, **kwargs) as response:
        return response.status, await response.json(content_type=None), response.headers


# -- statuses over the Ray Serve sidecar ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        ("/embed", b"{not json", "invalid_json"),
        ("/embed", b"[1, 2]", "invalid_json"),
        ("/embed", {"model": MINILM, "input": 5}, "invalid_type"),
        ("/embed", {"model": MINILM, "input": ["ok", 3]}, "invalid_type"),
        ("/embed", {"model": MINILM, "input": ["ok"], "truncate": "yes"}, "invalid_type"),
        ("/embed", {"model": MINILM, "input": []}, "empty_input"),
        ("/embed", {"input": ["no model"]}, "missing_field"),
        ("/embed", {"model": MINILM, "input": ["x"], "encoding_format": "hex"}, "invalid_encoding_format"),
        ("/embed", {"model": SIGLIP, "input": ["wrong route for an image model"]}, "wrong_model_kind"),
        ("/embed", {"model": MINILM, "input": ["x"], "return_sparse": True}, "sparse_unsupported"),
        ("/image", {"model": SIGLIP, "images": ["@@not base64@@"]}, "invalid_base64"),
        (
            "/image",
            {"model": SIGLIP, "images": [base64.b64encode(b"plain text, no image").decode()]},
            "invalid_image",
        ),
        ("/image", {"model": SIGLIP, "images": "not a list"}, "invalid_type"),
        ("/rerank", {"model": "tiny-reranker-random", "query": 7, "documents": ["a"]}, "invalid_type"),
    ],
)
async def test_400_bad_input(
    http: aiohttp.ClientSession, sidecar_url: str, path: str, body: object, code: str
) -> None:
    status, answer, _ = await _post(http, sidecar_url + path, body)
    assert status == 400, answer
    assert answer["error"]["code"] == code
    assert answer["error"]["message"]


LONE = "\ud800"  # a lone UTF-16 surrogate: valid JSON escape, not encodable text


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/embed", {"model": MINILM, "input": ["fine", "water" + LONE]}, "input[1]"),
        ("/text", {"model": SIGLIP, "input": [LONE]}, "input[0]"),
        ("/rerank", {"model": "tiny-reranker-random", "query": LONE, "documents": ["a"]}, "query"),
        (
            "/rerank",
            {"model": "tiny-reranker-random", "query": "q", "documents": ["a", LONE]},
            "documents[1]",
        ),
        ("/tokenize", {"model": MINILM, "input": LONE}, "input"),
        ("/v1/embeddings", {"model": MINILM, "input": [LONE]}, "input[0]"),
        ("/embed", {"model": MINILM, "input": ["x"], LONE: 1}, "\\ud800"),
    ],
)
async def test_lone_surrogates_are_a_400_naming_the_field(
    http: aiohttp.ClientSession, sidecar_url: str, path: str, body: object, field: str
) -> None:
    status, answer, _ = await _post(http, sidecar_url + path, body)
    assert (status, answer["error"]["code"]) == (400, "invalid_text"), answer
    assert f"'{field}'" in answer["error"]["message"]


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b'{"model": "all-minilm-l6-v2", "input": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", "json_too_deep"),
        (
            b'{"model": "all-minilm-l6-v2", "input": ["x"], "dimensions": ' + b"9" * 5000 + b"}",
            "number_too_long",
        ),
        (b'{"model": "all-minilm-l6-v2", "input": ["x"], "dimensions": NaN}', "invalid_json"),
        (b'{"model": "all-minilm-l6-v2", "input": ["\xff\xfe"]}', "invalid_json"),
    ],
)
async def test_parser_limits_are_400s(
    http: aiohttp.ClientSession, sidecar_url: str, raw: bytes, code: str
) -> None:
    for path in ("/embed", "/v1/embeddings"):
        status, answer, _ = await _post(http, sidecar_url + path, raw)
        assert (status, answer["error"]["code"]) == (400, code), answer


async def test_non_json_bodies_are_415(http: aiohttp.ClientSession, sidecar_url: str) -> None:
    body = json.dumps({"model": MINILM, "input": ["x"]}).encode()
    for headers in (
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "application/xml"},
        {"Content-Type": "application/json", "Content-Encoding": "gzip"},
    ):
        async with http.post(f"{sidecar_url}/embed", data=io.BytesIO(body), headers=headers) as response:
            assert response.status == 415, headers
            assert (await response.json(content_type=None))["error"]["code"] == "unsupported_media_type"
    status, answer, _ = await _post(http, f"{sidecar_url}/embed", body)  # application/json: served
    assert status == 200 and len(answer["embeddings"]) == 1


async def test_an_idle_keep_alive_connection_is_closed(sidecar_url: str) -> None:
    # The ingress's front closes a connection idle for keep_alive_timeout_s after an answer.
    host, port = sidecar_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 200")
        rest = await asyncio.wait_for(reader.read(), SIDECAR_KEEP_ALIVE_S + 15)  # the answer, then EOF
        assert rest.endswith(b"}")
    finally:
        writer.close()


async def test_a_request_head_that_never_completes_is_closed(sidecar_url: str) -> None:
    # Slow loris: a client trickling its headers holds a connection no longer than the keep-alive
    # timeout (Serve's own proxy had no such bound).
    host, port = sidecar_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
        for _ in range(4 * SIDECAR_KEEP_ALIVE_S):  # a header line every half second, never the end
            if reader.at_eof():
                break
            with contextlib.suppress(ConnectionError):
                writer.write(b"X-Slow: y\r\n")
                await writer.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(), 0.5)
        # Closed within the trickle: a bound in header lines sent (at least half a second apart),
        # which a loaded machine stretches rather than breaks.
        assert reader.at_eof(), "the connection was still open"
    finally:
        writer.close()


async def test_a_request_the_front_cannot_parse_gets_a_coded_json_400(sidecar_url: str) -> None:
    # aiohttp refuses a request line or header over 8 KiB before any handler runs; the front
    # answers that in the sidecar's envelope too, not in aiohttp's plain text.
    host, port = sidecar_url.removeprefix("http://").split(":")
    for request in (
        b"GET /healthz?" + b"x" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * 9000 + b"\r\n\r\n",
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(request)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 30)
        finally:
            writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split()[1] == b"400", head  # HTTP/1.0 when the request line itself was refused
        error = json.loads(body)["error"]
        assert error["code"] == "bad_http_request" and len(error["message"]) < 200
    async with aiohttp.ClientSession() as http, http.get(f"{sidecar_url}/healthz") as response:
        assert response.status == 200  # and the front serves on


async def test_the_ingress_health_probe_fails_once_its_front_stops_listening(
    sidecar_config: SidecarConfig,
) -> None:
    # The deployment's class outside Serve: its async constructor starts the front on this loop.
    from inference.serve_app import Ingress

    ingress = Ingress.func_or_class.__new__(Ingress.func_or_class)
    listen = {"host": "127.0.0.1", "port": free_port("127.0.0.1"), "request_timeout_s": 5.0,
              "keep_alive_timeout_s": 5.0}  # fmt: skip
    await ingress.__init__(sidecar_config.to_dict(), {}, None, listen)
    try:
        await ingress.check_health()  # listening: healthy
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{listen['port']}/healthz") as response:
                assert response.status == 200
    finally:
        await ingress._front.cleanup()
    with pytest.raises(RuntimeError, match="not listening"):
        await ingress.check_health()


async def test_a_stalled_body_gets_408_and_the_front_serves_on(
    http: aiohttp.ClientSession, sidecar_config: SidecarConfig, inference_encoders: dict[str, Encoder]
) -> None:
    # The same front the ingress replica runs (start_front), with a short request timeout.
    spec = sidecar_config.model(MINILM)
    service = ModelService(spec, sidecar_config.limits, inference_encoders[MINILM])
    service.ready = True
    api = SidecarAPI(
        dataclasses.replace(sidecar_config, models=(spec,)), {MINILM: LocalBackend(service)}, api_key=None
    )
    port = free_port("127.0.0.1")
    runner = await start_front(
        api, host="127.0.0.1", port=port, request_timeout_s=1.0, keep_alive_timeout_s=30
    )
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": '
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 60)  # the 408, then the connection closes
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408")
        assert json.loads(body)["error"]["code"] == "request_timeout"
        status, answer_json, _ = await _post(
            http, f"http://127.0.0.1:{port}/embed", {"model": MINILM, "input": ["x"]}
        )
        assert status == 200 and len(answer_json["embeddings"]) == 1
    finally:
        await runner.cleanup()
        await service.close()


async def test_404_unknown_model_and_route(http: aiohttp.ClientSession, sidecar_url: str) -> None:
    status, answer, _ = await _post(http, f"{sidecar_url}/embed", {"model": "bge-m3", "input": ["x"]})
    assert (status, answer["error"]["code"]) == (404, "model_not_found")
    async with http.get(f"{sidecar_url}/nowhere") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "not_found"


async def test_413_too_many_inputs_body_and_image_limits(
    http: aiohttp.ClientSession, sidecar_url: str, sidecar_config: SidecarConfig
) -> None:
    limit = sidecar_config.model(MINILM).max_client_batch
    status, answer, _ = await _post(
        http, f"{sidecar_url}/embed", {"model": MINILM, "input": ["x"] * (limit + 1)}
    )
    assert (status, answer["error"]["code"]) == (413, "too_many_inputs")

    big = {"model": MINILM, "input": ["x" * (sidecar_config.limits.max_body_bytes + 10)]}
    status, answer, _ = await _post(http, f"{sidecar_url}/embed", big)
    assert (status, answer["error"]["code"]) == (413, "body_too_large")

    status, answer, _ = await _post(
        http,
        f"{sidecar_url}/image",
        {"model": SIGLIP, "images": [base64.b64encode(bomb_png(50_000, 50_000)).decode()]},
    )
    assert (status, answer["error"]["code"]) == (413, "image_too_many_pixels")

    status, answer, _ = await _post(
        http,
        f"{sidecar_url}/image",
        {"model": SIGLIP, "images": [base64.b64encode(bomb_png(3000, 3000)).decode()]},
    )
    assert (status, answer["error"]["code"]) == (413, "image_too_many_pixels")  # 9 MP > the 4 MP test limit

    too_heavy = base64.b64encode(b"\0" * (sidecar_config.limits.max_image_bytes + 1)).decode()
    status, answer, _ = await _post(http, f"{sidecar_url}/image", {"model": SIGLIP, "images": [too_heavy]})
    assert (status, answer["error"]["code"]) == (413, "image_too_large")

    # The service is still up and answering.
    status, answer, _ = await _post(http, f"{sidecar_url}/image", {"model": SIGLIP, "images": [_png()]})
    assert status == 200 and len(answer["embeddings"]) == 1


async def test_422_over_long_text_unless_truncated(http: aiohttp.ClientSession, sidecar_url: str) -> None:
    long_text = "amphora " * 600
    status, answer, _ = await _post(
        http, f"{sidecar_url}/embed", {"model": MINILM, "input": ["short", long_text]}
    )
    assert (status, answer["error"]["code"]) == (422, "input_too_long")
    assert "256" in answer["error"]["message"]
    status, answer, _ = await _post(http, f"{sidecar_url}/text", {"model": SIGLIP, "input": [long_text]})
    assert status == 422
    status, answer, _ = await _post(
        http, f"{sidecar_url}/embed", {"model": MINILM, "input": ["short", long_text], "truncate": True}
    )
    assert status == 200 and len(answer["embeddings"]) == 2
    assert answer["usage"]["tokens"] <= 2 * 256


# -- behaviour over the Ray Serve sidecar --------------------------------------------------------


async def test_concurrent_callers_each_get_their_own_vectors(
    http: aiohttp.ClientSession, sidecar_url: str
) -> None:
    words = "amphora coin dam village harvest mill letter mayor flood road".split()
    requests = [[" ".join(words[: (i % 9) + 1]) + f" {i}", f"item {i} " + words[i % 10]] for i in range(16)]

    async def embed(texts: list[str]) -> np.ndarray:
        status, answer, _ = await _post(http, f"{sidecar_url}/embed", {"model": MINILM, "input": texts})
        assert status == 200
        return np.asarray(answer["embeddings"], dtype=np.float32)

    together = await asyncio.gather(*(embed(texts) for texts in requests))
    for texts, vectors in zip(requests, together, strict=True):
        alone = np.concatenate([await embed([t]) for t in texts])
        np.testing.assert_allclose(vectors, alone, atol=2e-5)


async def test_sparse_and_dense_through_http(http: aiohttp.ClientSession, sidecar_url: str) -> None:
    body = {"model": "tiny-bge-m3-random", "input": "amphora amphora coin", "return_sparse": True}
    status, answer, _ = await _post(http, f"{sidecar_url}/embed", body)
    assert status == 200
    (weights,) = answer["sparse"]
    assert weights and all(int(k) > 4 and v > 0 for k, v in weights.items())  # ids 0..4 are special
    assert np.linalg.norm(answer["embeddings"][0]) == pytest.approx(1.0, abs=1e-5)


async def test_tokenize_counts_as_the_model_does(http: aiohttp.ClientSession, sidecar_url: str) -> None:
    status, answer, _ = await _post(
        http, f"{sidecar_url}/tokenize", {"model": MINILM, "input": ["a", "a b c"]}
    )
    assert status == 200
    assert answer["tokens"] == [3, 5]  # [CLS] ... [SEP]


async def test_readyz_and_models(http: aiohttp.ClientSession, sidecar_url: str) -> None:
    async with http.get(f"{sidecar_url}/readyz") as response:
        assert response.status == 200
        assert all((await response.json())["models"].values())
    # /models states what each model can do, so no caller has to probe for a sparse head.
    async with SidecarClient(sidecar_url) as client:
        models = {m.id: m for m in await client.models()}
    assert {model: sorted(info.capabilities) for model, info in models.items()} == {
        MINILM: ["dense"],
        "tiny-bge-m3-random": ["dense", "sparse"],
        "tiny-siglip-random": ["dense", "image", "text"],
        "tiny-reranker-random": ["rerank"],
    }
    assert models["tiny-bge-m3-random"].sparse and not models[MINILM].sparse


async def test_the_official_openai_sdk_lists_models_and_embeds(sidecar_url: str) -> None:
    """OpenAI-compatible means the official SDK works unchanged against ``RAG_SIDECAR_URL/v1``."""
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=f"{sidecar_url}/v1", api_key="unused", max_retries=0) as sdk:
        listed = [model.id async for model in sdk.models.list()]
        floats = await sdk.embeddings.create(model=MINILM, input=["a coin", "an amphora"])
        packed = await sdk.embeddings.create(model=MINILM, input=["a coin"], encoding_format="base64")
    assert sorted(listed) == sorted(
        [MINILM, "tiny-bge-m3-random", "tiny-siglip-random", "tiny-reranker-random"]
    )
    assert [d.index for d in floats.data] == [0, 1] and len(floats.data[0].embedding) == 384
    first = np.frombuffer(base64.b64decode(packed.data[0].embedding), dtype=np.float32)  # type: ignore[arg-type]
    assert np.allclose(first, floats.data[0].embedding, atol=1e-5)


async def test_every_error_code_the_server_answers_is_in_the_one_table(sidecar_url: str) -> None:
    """The client reads codes back as ``ErrorCode`` members; callers compare with the enum."""
    async with SidecarClient(sidecar_url) as client:
        with pytest.raises(SidecarRejected) as err:
            await client.embed(MINILM, ["x"], return_sparse=True)
    assert err.value.code is ErrorCode.SPARSE_UNSUPPORTED


# -- states held in place: the same API on an in-process server ----------------------------------


@dataclasses.dataclass
class LocalSidecar:
    url: str
    services: dict[str, ModelService]


async def _local(
    config: SidecarConfig,
    encoders: dict[str, Encoder],
    models: list[str],
    *,
    warm: bool = True,
    api_key: str | None = None,
    executor: ThreadPoolExecutor | None = None,
    **spec_changes: int,
) -> tuple[TestServer, LocalSidecar]:
    services = {}
    for model in models:
        spec = dataclasses.replace(config.model(model), **spec_changes)
        service = ModelService(spec, config.limits, encoders[model], device_executor=executor)
        if warm:
            service.ready = True  # the shared encoder already ran a real forward pass in this session
        services[model] = service
    sub_config = dataclasses.replace(config, models=tuple(s.spec for s in services.values()))
    api = SidecarAPI(sub_config, {m: LocalBackend(s) for m, s in services.items()}, api_key=api_key)
    server = TestServer(create_app(api), host="127.0.0.1")
    await server.start_server()
    return server, LocalSidecar(str(server.make_url("")).rstrip("/"), services)


async def test_429_over_the_admission_bound_with_retry_after(
    http: aiohttp.ClientSession, sidecar_config: SidecarConfig, inference_encoders: dict[str, Encoder]
) -> None:
    executor = ThreadPoolExecutor(1)
    gate = threading.Event()
    executor.submit(gate.wait)  # the device thread is busy: admitted work stays admitted
    server, local = await _local(
        sidecar_config,
        inference_encoders,
        ["tiny-bge-m3-random"],
        executor=executor,
        max_queued_items=16,
        max_client_batch=16,
        max_batch_size=16,
    )
    try:
        body = {"model": "tiny-bge-m3-random", "input": [f"text {i}" for i in range(16)]}
        first = asyncio.create_task(_post(http, f"{local.url}/embed", body))
        service = local.services["tiny-bge-m3-random"]
        await until(
            "service.stats()['main']['pending_items'] >= 16",
            lambda: service.stats()["main"]["pending_items"] >= 16,
            every_s=0.001,
        )
        status, answer, headers = await _post(
            http, f"{local.url}/embed", {"model": "tiny-bge-m3-random", "input": ["one more"]}
        )
        assert (status, answer["error"]["code"]) == (429, "overloaded")
        assert int(headers["Retry-After"]) >= 1
        gate.set()
        status, answer, _ = await first
        assert status == 200 and len(answer["embeddings"]) == 16
        status, _, _ = await _post(
            http, f"{local.url}/embed", {"model": "tiny-bge-m3-random", "input": ["one more"]}
        )
        assert status == 200
    finally:
        gate.set()
        await server.close()
        executor.shutdown()


async def test_503_until_warm_up_has_run_a_real_forward_pass(
    http: aiohttp.ClientSession, sidecar_config: SidecarConfig, inference_encoders: dict[str, Encoder]
) -> None:
    server, local = await _local(sidecar_config, inference_encoders, ["tiny-reranker-random"], warm=False)
    try:
        async with http.get(f"{local.url}/readyz") as response:
            assert response.status == 503
            assert response.headers["Retry-After"]
        body = {"model": "tiny-reranker-random", "query": "q", "documents": ["d"]}
        status, answer, headers = await _post(http, f"{local.url}/rerank", body)
        assert (status, answer["error"]["code"]) == (503, "not_ready")
        assert headers["Retry-After"]
        await local.services["tiny-reranker-random"].warm_up_async()
        async with http.get(f"{local.url}/readyz") as response:
            assert response.status == 200
        status, answer, _ = await _post(http, f"{local.url}/rerank", body)
        assert status == 200 and len(answer["scores"]) == 1
    finally:
        await server.close()


async def test_model_error_reaches_every_waiter_and_the_next_request_succeeds(
    http: aiohttp.ClientSession,
    sidecar_config: SidecarConfig,
    inference_encoders: dict[str, Encoder],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encoder = inference_encoders["tiny-bge-m3-random"]
    real_run = encoder.run_batch
    gate = threading.Event()
    recovered = threading.Event()
    calls: list[int] = []

    # Every forward pass fails until the test says the device recovered: the four callers may land in
    # one batch or (on a loaded machine, the wait window closing early) in several, and each must
    # get its 500 either way.
    def flaky(items):
        gate.wait()
        calls.append(len(items))
        if not recovered.is_set():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real_run(items)

    monkeypatch.setattr(encoder, "run_batch", flaky)
    server, local = await _local(sidecar_config, inference_encoders, ["tiny-bge-m3-random"])
    try:
        bodies = [{"model": "tiny-bge-m3-random", "input": [f"caller {i}", f"second {i}"]} for i in range(4)]
        tasks = [asyncio.create_task(_post(http, f"{local.url}/embed", b)) for b in bodies]
        service = local.services["tiny-bge-m3-random"]
        await until(
            "service.stats()['main']['pending_items'] >= 8",
            lambda: service.stats()["main"]["pending_items"] >= 8,
            every_s=0.001,
        )
        gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
        for status, answer, _ in answers:
            assert status == 500
            assert answer["error"]["code"] == "model_error"
            assert "illegal memory" not in answer["error"]["message"]  # no raw exception text leaks
        assert sum(calls) == 8  # every item reached a (failing) forward pass: none was dropped
        recovered.set()
        status, answer, _ = await _post(http, f"{local.url}/embed", bodies[0])
        assert status == 200 and len(answer["embeddings"]) == 2
        assert service.healthy()
    finally:
        await server.close()


async def test_a_models_nan_is_a_coded_500_in_every_encoding(
    http: aiohttp.ClientSession,
    sidecar_config: SidecarConfig,
    inference_encoders: dict[str, Encoder],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The JSON encoder writes NaN as null and base64 carries it as bytes: either way a caller would
    # index a vector that matches nothing (or everything). The sidecar refuses it instead.
    embedder = inference_encoders["tiny-bge-m3-random"]
    reranker = inference_encoders["tiny-reranker-random"]
    real_embed, real_rerank = embedder.run_batch, reranker.run_batch
    poisoned = {"on": True}

    def nan_vectors(items):
        results = real_embed(items)
        if not poisoned["on"]:
            return results
        return [dataclasses.replace(results[0], dense=np.full_like(results[0].dense, np.nan)), *results[1:]]

    def nan_scores(items):  # a NaN logit (an infinite one is a sigmoid's 1.0: a valid score)
        scores = real_rerank(items)
        return [float("nan"), *scores[1:]] if poisoned["on"] else scores

    monkeypatch.setattr(embedder, "run_batch", nan_vectors)
    monkeypatch.setattr(reranker, "run_batch", nan_scores)
    server, local = await _local(
        sidecar_config, inference_encoders, ["tiny-bge-m3-random", "tiny-reranker-random"]
    )
    embed = {"model": "tiny-bge-m3-random", "input": ["one", "two"]}
    rerank = {"model": "tiny-reranker-random", "query": "q", "documents": ["d", "e"]}
    try:
        for path, body in [
            ("/embed", embed),
            ("/embed", {**embed, "encoding_format": "base64"}),
            ("/v1/embeddings", embed),
            ("/rerank", rerank),
        ]:
            status, answer, _ = await _post(http, local.url + path, body)
            assert (status, answer["error"]["code"]) == (500, "model_error"), path
            assert "non-finite" in answer["error"]["message"], path
        poisoned["on"] = False  # the replica stays up: the next batch is answered
        status, answer, _ = await _post(http, f"{local.url}/embed", embed)
        assert status == 200 and all(all(np.isfinite(v)) for v in answer["embeddings"])
        status, answer, _ = await _post(http, f"{local.url}/rerank", rerank)
        assert status == 200 and len(answer["scores"]) == 2
    finally:
        await server.close()


async def test_api_key_guards_every_route_but_health(
    http: aiohttp.ClientSession, sidecar_config: SidecarConfig, inference_encoders: dict[str, Encoder]
) -> None:
    server, local = await _local(
        sidecar_config, inference_encoders, ["tiny-reranker-random"], api_key="s3cret"
    )
    try:
        body = {"model": "tiny-reranker-random", "query": "q", "documents": ["d"]}
        status, answer, _ = await _post(http, f"{local.url}/rerank", body)
        assert (status, answer["error"]["code"]) == (401, "unauthorized")
        async with http.post(
            f"{local.url}/rerank", json=body, headers={"Authorization": "Bearer wrong"}
        ) as r:
            assert r.status == 401
        async with http.post(
            f"{local.url}/rerank", json=body, headers={"Authorization": "Bearer s3cret"}
        ) as r:
            assert r.status == 200
        for path in ("/models", "/metrics"):
            async with http.get(local.url + path) as r:
                assert r.status == 401
        for path in ("/healthz", "/readyz"):
            async with http.get(local.url + path) as r:
                assert r.status == 200
    finally:
        await server.close()


async def test_models_reports_the_warm_up_figures_once_the_model_is_warm(
    sidecar_config: SidecarConfig, inference_encoders: dict[str, Encoder]
) -> None:
    # A Ray-free sidecar answers /models while its model warms up (the fault benchmarks' does): what
    # the warm-up measures must not stay unknown in the answer afterwards.
    spec = sidecar_config.model(MINILM)
    service = ModelService(spec, sidecar_config.limits, inference_encoders[MINILM])
    api = SidecarAPI(
        dataclasses.replace(sidecar_config, models=(spec,)), {MINILM: LocalBackend(service)}, api_key=None
    )

    async def overhead() -> float | None:
        answer = await api.handle("GET", "/models", {}, b"")
        assert answer.status == 200
        (info,) = json.loads(answer.body)["models"]
        return info["batch_overhead_tokens"]

    try:
        assert await overhead() is None  # not warmed up yet
        await service.warm_up_async()
        measured = await overhead()
        assert isinstance(measured, float)  # its value is the clock's: pass_overhead_tokens's tests
        assert await overhead() == measured  # kept from now on
    finally:
        await service.close()
