"""Fail fast instead of holding (issue 25, item 3), on the real Ray Serve sidecar.

Each test deploys an application of its own (one tiny text model) into the session's Ray, beside
the session sidecar, and kills that application's replica with ``ray.kill``. Nothing here measures
time: the figures (seconds to the 503, p99 during a kill) are the reliability suite's.
"""

from __future__ import annotations

import http.client
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import ray

from benchmarks.replica_kill import live_replicas, replica_killed_under_load
from inference.config import ConfigError, SidecarConfig, config_from_dict
from inference.errors import ErrorCode
from inference.launcher import SidecarStartTimeout, running_sidecar
from inference.serve_app import deployment_name
from inference.settings import SidecarSettings, load_settings
from inference.tiny import build_tiny_model

MODEL = "failfast-tiny-xlmr-random"
# Only a safety net: a call that held until a replacement is warm would never return here (the
# replacement cannot load), and this timeout turns that hang into a failure instead of a stuck run.
SAFETY_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def weights() -> Iterator[Path]:
    """A tiny XLM-R built once, outside pytest's basetemp (Ray replicas load from it)."""
    root = Path(tempfile.mkdtemp(prefix="mnemo-failfast-"))
    try:
        yield build_tiny_model("tiny-xlmr-sparse", root / "built", seed=0)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _config(weights: Path, replicas: int) -> SidecarConfig:
    # No ``build`` recipe: a replica whose weights directory is gone fails to load (it is not rebuilt).
    model = {"id": MODEL, "kind": "text", "weights": str(weights), "pooling": "cls", "replicas": replicas}
    small = {"max_batch_size": 8, "max_batch_tokens": 1024, "max_client_batch": 16, "max_queued_items": 64}
    return config_from_dict(
        {"models": [{**model, **small, "num_cpus": 0.05}]}, source="tests/test_failfast.py"
    )


def _embed(url: str) -> tuple[int, dict, str | None]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=SAFETY_TIMEOUT_S)
    try:
        body = json.dumps({"model": MODEL, "input": ["a red-figure amphora"]})
        conn.request("POST", "/embed", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read()), response.getheader("Retry-After")
    finally:
        conn.close()


@pytest.mark.ray
def test_a_model_whose_only_replica_is_gone_answers_503_not_ready(sidecar_url: str, weights: Path) -> None:
    """The only replica is killed and its replacement cannot load (its weights were removed): a call
    that waited for a live replica would never return; it answers a coded 503 with Retry-After."""
    unloadable = weights.parent / "unloadable"
    shutil.copytree(weights, unloadable)
    with running_sidecar(_config(unloadable, replicas=1), app_name="mnemo-failfast-one", api_key="") as url:
        status, body, _ = _embed(url)
        assert status == 200 and len(body["embeddings"]) == 1, body
        ((name, namespace),) = live_replicas(deployment_name(MODEL), "mnemo-failfast-one")
        shutil.rmtree(unloadable)

        ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
        for _ in range(2):  # the call the dead replica may still be assigned, then one the router holds
            status, body, retry_after = _embed(url)
            assert status == 503, body
            assert body["error"]["code"] == ErrorCode.NOT_READY, body
            assert retry_after is not None and int(retry_after) >= 1, retry_after


@pytest.mark.ray
def test_one_of_two_replicas_killed_under_load_fails_no_request(sidecar_url: str, weights: Path) -> None:
    """With a second replica, a call whose replica died runs again on the other one: no caller sees
    even a retryable answer, none fails or hangs."""
    with running_sidecar(_config(weights, replicas=2), app_name="mnemo-failfast-two", api_key="") as url:
        result = replica_killed_under_load(
            url, MODEL, callers=3, warm_s=0.5, retry_for_s=0, after_recovery_s=0.5, app="mnemo-failfast-two"
        )
    assert result["replicas"] == 2 and result["requests_after_kill"] > 0, json.dumps(result)
    assert result["failed_after_retries"] == 0, result
    assert set(result["statuses"]) == {"200"}, result  # not one 503 either: the ingress moved the call
    assert result["server_errors"] == 0 and result["dropped"] == 0 and result["hung_callers"] == 0, result


@pytest.mark.ray
def test_a_replica_that_cannot_be_placed_fails_the_start_with_serves_status(
    sidecar_url: str, weights: Path
) -> None:
    """Serve waits for RUNNING without a bound; the launcher's own bound turns a replica that can
    never be placed (more CPUs than the cluster has) into an error naming the stuck deployment."""
    spec = {"id": MODEL, "kind": "text", "weights": str(weights), "pooling": "cls", "num_cpus": 64}
    with pytest.raises(SidecarStartTimeout) as failure:
        with running_sidecar(
            config_from_dict({"models": [spec]}, source="tests/test_failfast.py"),
            app_name="mnemo-failfast-unplaceable",
            api_key="",
            ready_timeout_s=5,
        ):
            pytest.fail("an application whose replica needs 64 CPUs cannot be RUNNING on this session's Ray")
    assert "mnemo-failfast-unplaceable" in str(failure.value)
    assert deployment_name(MODEL) in str(failure.value), failure.value


@pytest.mark.parametrize("wait", [0, -1, "2s", True, float("inf")])
def test_the_replica_wait_is_a_positive_number_of_seconds(wait: object) -> None:
    model = {"id": "a", "kind": "text", "weights": "/x"}
    with pytest.raises(ConfigError, match="replica_wait_s"):
        config_from_dict({"limits": {"replica_wait_s": wait}, "models": [model]})
    assert config_from_dict({"models": [model]}).limits.replica_wait_s == 1.5  # the default: a 503 within 2 s


def test_the_cluster_address_comes_from_the_flag_or_rag_ray_address() -> None:
    assert load_settings(SidecarSettings, {}).ray_address is None  # default: a local Ray instance
    assert (
        load_settings(SidecarSettings, {"RAG_RAY_ADDRESS": "ray://head:10001"}).ray_address
        == "ray://head:10001"
    )
    flag = load_settings(
        SidecarSettings, {"RAG_RAY_ADDRESS": "ray://head:10001"}, ray_address="10.0.0.2:6379"
    )
    assert flag.ray_address == "10.0.0.2:6379"
