"""Coalescing at the ingress: concurrent /embed calls share one Ray call, and each still gets its own.

The coalescer is driven directly (its ``send`` held shut to make bundles deterministic), the service's
``embed_many`` runs the real tiny model, and the last test goes through the session's Ray Serve sidecar.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Hashable

import aiohttp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.coalesce import CallCoalescer
from inference.config import ModelSpec
from inference.encoders import Encoder
from inference.errors import BadRequest, ErrorCode, InputTooLong, NotReady, SidecarApiError
from inference.service import ModelService

MINILM = "all-minilm-l6-v2"


async def _settle() -> None:
    """Let every ready task run (a call's task, then the bundle's send it starts)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def _busy_lane() -> tuple[_HeldSend, CallCoalescer, asyncio.Task]:
    """A coalescer with one lane whose only bundle (the "lead" call) is held in flight."""
    send = _HeldSend()
    send.release.clear()
    coalescer = CallCoalescer(send, max_in_flight=1)
    lead = asyncio.create_task(coalescer.call("k", "lead"))
    await _settle()
    return send, coalescer, lead


class _HeldSend:
    """A ``send`` that records each bundle and answers only when released (per-argument outcomes)."""

    def __init__(self) -> None:
        self.bundles: list[tuple[Hashable, list[str]]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.fail_call: Exception | None = None

    async def __call__(self, key: Hashable, arguments: list[str]) -> list[object]:
        self.bundles.append((key, list(arguments)))
        await self.release.wait()
        if self.fail_call is not None:
            raise self.fail_call
        return [
            BadRequest(f"bad {a}", code=ErrorCode.EMPTY_INPUT) if a.startswith("bad") else f"{key}:{a}"
            for a in arguments
        ]


async def test_a_lone_call_goes_at_once_and_waiting_calls_share_the_next_bundle() -> None:
    send = _HeldSend()
    send.release.clear()
    coalescer = CallCoalescer(send, max_in_flight=1)
    first = asyncio.create_task(coalescer.call("k", "a0"))
    await _settle()
    assert send.bundles == [("k", ["a0"])]  # sent before any company arrived: no added latency
    rest = [asyncio.create_task(coalescer.call("k", f"a{i}")) for i in range(1, 10)]
    await _settle()
    assert len(send.bundles) == 1  # the lane is busy: they wait
    send.release.set()
    assert await first == "k:a0"
    assert await asyncio.gather(*rest) == [f"k:a{i}" for i in range(1, 10)]
    assert send.bundles[1] == ("k", [f"a{i}" for i in range(1, 10)])
    assert (coalescer.calls, coalescer.bundles) == (10, 2)


async def test_keys_never_share_a_bundle_and_bundles_are_bounded() -> None:
    send = _HeldSend()
    send.release.clear()
    coalescer = CallCoalescer(send, max_in_flight=1, max_bundle=3)
    calls = [asyncio.create_task(coalescer.call(("t", i % 2), f"x{i}")) for i in range(9)]
    await _settle()
    send.release.set()
    results = await asyncio.gather(*calls)
    assert results == [f"{('t', i % 2)}:x{i}" for i in range(9)]
    for key, arguments in send.bundles:
        assert len(arguments) <= 3
        assert all(int(a[1:]) % 2 == key[1] for a in arguments)
    assert sorted(a for _, args in send.bundles for a in args) == sorted(f"x{i}" for i in range(9))


async def test_one_callers_bad_input_fails_only_that_caller() -> None:
    send, coalescer, lead = await _busy_lane()
    good = asyncio.create_task(coalescer.call("k", "good"))
    bad = asyncio.create_task(coalescer.call("k", "bad input"))
    send.release.set()
    assert await lead == "k:lead"
    assert await good == "k:good"
    with pytest.raises(BadRequest, match="bad input"):
        await bad
    assert send.bundles[1] == ("k", ["good", "bad input"])


async def test_a_failed_call_reaches_every_caller_of_its_bundle_and_the_next_bundle_runs() -> None:
    send = _HeldSend()
    send.fail_call = NotReady("replica gone", retry_after=5)
    coalescer = CallCoalescer(send, max_in_flight=2)
    results = await asyncio.gather(*(coalescer.call("k", f"a{i}") for i in range(5)), return_exceptions=True)
    assert all(isinstance(r, NotReady) for r in results)
    send.fail_call = None
    assert await coalescer.call("k", "after") == "k:after"


async def test_a_shared_failure_fails_the_calls_waiting_behind_its_bundle_without_sending_them() -> None:
    """No replica took the bundle (503 not_ready): the calls queued behind it meet the same answer at
    once instead of waiting their own turn for it; another failure leaves them to their own bundle."""
    for failure, shared in (
        (NotReady("no replica", retry_after=2), True),
        (RuntimeError("model broke"), False),
    ):
        send = _HeldSend()
        send.release.clear()
        send.fail_call = failure
        coalescer = CallCoalescer(send, max_in_flight=1, shared_failures=(NotReady,))
        calls = [asyncio.create_task(coalescer.call("k", f"a{i}")) for i in range(4)]
        await _settle()
        assert send.bundles == [("k", ["a0"])]  # a1..a3 wait behind the lead bundle
        send.release.set()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(r is failure for r in results), results
        assert len(send.bundles) == (1 if shared else 2), send.bundles


async def test_a_cancelled_caller_is_dropped_and_its_neighbours_are_served() -> None:
    send, coalescer, lead = await _busy_lane()
    gone = asyncio.create_task(coalescer.call("k", "gone"))
    stays = asyncio.create_task(coalescer.call("k", "stays"))
    await _settle()
    gone.cancel()
    send.release.set()
    assert await lead == "k:lead" and await stays == "k:stays"
    assert gone.cancelled()
    assert send.bundles[1] == ("k", ["stays"])  # never sent: its caller had gone


@settings(max_examples=40, deadline=None)
@given(
    delays=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=40),
    in_flight=st.integers(min_value=1, max_value=3),
    max_bundle=st.integers(min_value=1, max_value=8),
)
def test_every_caller_gets_exactly_its_own_outcome(
    delays: list[int], in_flight: int, max_bundle: int
) -> None:
    async def scenario() -> None:
        async def send(key: Hashable, arguments: list[str]) -> list[object]:
            await _settle()
            return [f"{key}:{a}" for a in arguments]

        coalescer = CallCoalescer(send, max_in_flight=in_flight, max_bundle=max_bundle)

        async def caller(i: int, delay: int) -> str:
            for _ in range(delay):
                await _settle()
            return await coalescer.call(i % 3, str(i))

        results = await asyncio.gather(*(caller(i, d) for i, d in enumerate(delays)))
        assert results == [f"{i % 3}:{i}" for i in range(len(delays))]
        assert coalescer.bundles <= coalescer.calls == len(delays)

    asyncio.run(scenario())


def test_bad_limits_are_refused() -> None:
    async def send(key: Hashable, arguments: list[str]) -> list[object]:
        return arguments

    with pytest.raises(ValueError, match="at least 1"):
        CallCoalescer(send, max_in_flight=0)


def test_coalesce_in_flight_defaults_to_two_per_replica_and_zero_turns_it_off() -> None:
    spec = ModelSpec(id="m", kind="text", weights="/nowhere", replicas=3)
    assert spec.bundles_in_flight == 6
    off = ModelSpec(id="m", kind="text", weights="/nowhere", coalesce_in_flight=0)
    assert off.bundles_in_flight == 0
    from inference.config import ConfigError

    with pytest.raises(ConfigError, match="coalesce_in_flight"):
        ModelSpec(id="m", kind="text", weights="/nowhere", coalesce_in_flight=-1).validate()


# -- the service: several requests in one call, each answered on its own ------------------------


async def test_embed_many_answers_each_group_as_embed_would(inference_encoders: dict[str, Encoder]) -> None:
    encoder = inference_encoders[MINILM]
    service = ModelService(encoder.spec, encoder=encoder)
    service.ready = True  # the session's encoders are warm already
    try:
        groups = [["amphora", "a silver denarius"], [], ["flood " * 600], ["the dam and the village"]]
        outcomes = await service.embed_many(groups, truncate=False)
        assert isinstance(outcomes[1], SidecarApiError) and outcomes[1].code == "empty_input"
        assert isinstance(outcomes[2], InputTooLong)
        for index in (0, 3):
            alone = await service.embed(groups[index])
            assert isinstance(outcomes[index], dict)
            np.testing.assert_allclose(outcomes[index]["dense"], alone["dense"], atol=2e-5)
            assert outcomes[index]["tokens"] == alone["tokens"]
        with pytest.raises(InputTooLong):  # embed() raises its one group's fault
            await service.embed(groups[2])
    finally:
        await service.close()


# -- through the Ray Serve sidecar ---------------------------------------------------------------


def _coalesced(metrics: str) -> tuple[float, float]:
    def value(name: str) -> float:
        match = re.search(rf'^{name}_total{{model="{MINILM}"}} ([0-9.e+]+)$', metrics, re.MULTILINE)
        assert match, f"{name} for {MINILM} missing from /metrics"
        return float(match.group(1))

    return value("mnemo_sidecar_coalesced_calls"), value("mnemo_sidecar_coalesced_bundles")


async def test_concurrent_one_item_requests_share_ray_calls_and_keep_their_own_answers(
    sidecar_url: str,
) -> None:
    texts = [f"item {i}: " + "amphora coin dam village harvest mill"[: 6 + 3 * i] for i in range(24)]
    texts[7] = "flood " * 600  # over the 256-token limit: a 422 for this caller only

    async with aiohttp.ClientSession() as http:

        async def embed(text: str) -> tuple[int, dict]:
            body = json.dumps({"model": MINILM, "input": [text]})
            headers = {"Content-Type": "application/json"}
            async with http.post(f"{sidecar_url}/embed", data=body, headers=headers) as response:
                return response.status, await response.json()

        async def metrics() -> str:
            async with http.get(f"{sidecar_url}/metrics") as response:
                return await response.text()

        calls_before, bundles_before = _coalesced(await metrics())
        together = await asyncio.gather(*(embed(t) for t in texts))
        calls_after, bundles_after = _coalesced(await metrics())
        assert calls_after - calls_before == len(texts)
        assert bundles_after - bundles_before < len(texts)  # some requests shared a Ray call

        for i, (status, answer) in enumerate(together):
            if i == 7:
                assert (status, answer["error"]["code"]) == (422, "input_too_long")
                continue
            assert status == 200
            alone_status, alone = await embed(texts[i])
            assert alone_status == 200
            np.testing.assert_allclose(answer["embeddings"], alone["embeddings"], atol=2e-5)
