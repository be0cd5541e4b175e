"""Faults injected into real services, as the reliability suite does, with small budgets: nothing lost.

PostgreSQL is a server of the test's own (never the session's shared one): it is stopped with
``pg_ctl stop -m immediate`` in the middle of a drain and started again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.faults import postgres_stopped_mid_drain, replica_killed_under_load
from tests.fixtures.gateway import TEXT_MODEL

pytestmark = pytest.mark.ray


async def test_postgres_stopped_hard_mid_drain_loses_no_record(sidecar_url: str, tmp_path: Path) -> None:
    result = await postgres_stopped_mid_drain(sidecar_url, tmp_path, text_model=TEXT_MODEL, records=24)
    assert 0 < result["queued_when_stopped"] < result["records"], result  # stopped mid-drain
    assert result["records_lost"] == 0 and result["chunks"] == result["chunks_clean"] > 0, result
    assert result["queue_left"] == 0 and result["parked"] == 0 and result["recovery_s"] is not None, result


def test_a_killed_model_replica_fails_no_request(sidecar_url: str) -> None:
    """``ray.kill`` of the text model's replica under load: coded retryable answers while Serve
    replaces it, never a 500, a drop or a hang; every request succeeds within its retries."""
    result = replica_killed_under_load(sidecar_url, TEXT_MODEL, callers=3, warm_s=0.5)
    assert result["requests_after_kill"] > 0 and result["replaced_s"] is not None, json.dumps(result)
    assert result["server_errors"] == 0 and result["dropped"] == 0 and result["hung_callers"] == 0, result
    assert result["failed_after_retries"] == 0, result
