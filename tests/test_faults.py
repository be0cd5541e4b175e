"""Faults injected into real services, as the reliability suite does, with small budgets: nothing lost.

PostgreSQL is a server of the test's own (never the session's shared one): it is stopped with
``pg_ctl stop -m immediate`` in the middle of a drain and started again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.faults import drain_worker_killed, postgres_stopped_mid_drain, sidecar_stopped_mid_drain
from benchmarks.load_held import gateway_mixed_load, sidecar_overload
from benchmarks.replica_kill import replica_killed_under_load
from benchmarks.suite_reliability import DESCRIPTORS, corpus_records
from inference.config import SidecarConfig
from schema import EmbeddedPostgres
from tests.fixtures.gateway import ADMIN, TEXT_MODEL, running_gateway


@pytest.mark.ray
async def test_postgres_stopped_hard_mid_drain_loses_no_record(
    sidecar_url: str, outside_basetemp: Path
) -> None:
    # The fault's own PostgreSQL keeps its data outside pytest's basetemp (see outside_basetemp): it is
    # stopped and started again mid-test, and must still reach its files then.
    result = await postgres_stopped_mid_drain(
        sidecar_url, outside_basetemp, text_model=TEXT_MODEL, records=24
    )
    assert 0 < result["queued_when_stopped"] < result["records"], result  # stopped mid-drain
    assert result["records_lost"] == 0 and result["chunks"] == result["chunks_clean"] > 0, result
    assert result["queue_left"] == 0 and result["parked"] == 0 and result["recovery_s"] is not None, result
    # The worker gave back the claims its interrupted pass held and took them again, rather than
    # waiting out their leases (a minute by default) after an outage of a second.
    assert result["claims_given_back"] > 0, result


async def test_a_drain_worker_killed_mid_batch_loses_and_duplicates_nothing(
    pg_server: EmbeddedPostgres, sidecar_url: str, tmp_path: Path
) -> None:
    """One of three `mnemo drain` processes is killed with SIGKILL holding leases: the others take
    its records over after the lease expires, and the store equals a clean run's."""
    result = await drain_worker_killed(
        pg_server.url, sidecar_url, tmp_path, text_model=TEXT_MODEL, records=24
    )
    assert result["orphaned_records"] > 0 and 0 < result["queued_at_kill"] < result["records"], (
        result
    )  # mid-work
    assert result["records_lost"] == 0 and result["duplicate_rows"] == 0, result
    assert result["chunks"] == result["chunks_clean"] > 0 and result["queue_left"] == 0, result
    assert result["orphans_indexed_s"] is not None and result["surviving_workers"] == 2, result


@pytest.mark.ray
def test_a_killed_model_replica_fails_no_request(sidecar_url: str) -> None:
    """``ray.kill`` of the text model's replica under load: coded retryable answers while Serve
    replaces it, never a 500, a drop or a hang; every request succeeds within its retries."""
    # Each request retries for as long as Serve is given to replace the replica (the default).
    result = replica_killed_under_load(sidecar_url, TEXT_MODEL, callers=3, warm_s=0.5)
    assert result["requests_after_kill"] > 0 and result["replaced_s"] is not None, json.dumps(result)
    assert result["server_errors"] == 0 and result["dropped"] == 0 and result["hung_callers"] == 0, result
    assert result["failed_after_retries"] == 0, result


async def test_a_sidecar_stopped_mid_drain_loses_no_record(
    pg_server: EmbeddedPostgres, sidecar_config: SidecarConfig
) -> None:
    """The sidecar goes away (connections refused), then comes back loading its model (503 not
    ready): the records wait, none spends its attempts or is parked, and the store equals a clean run's."""
    spec = sidecar_config.model(TEXT_MODEL)
    result = await sidecar_stopped_mid_drain(
        pg_server.url, spec, sidecar_config.limits, records=24, down_s=2.0
    )
    assert 0 < result["queued_when_stopped"] < result["records"], result
    assert result["queued_when_restarted"] > 0, result  # the records waited for the sidecar
    assert result["records_lost"] == 0 and result["chunks"] == result["chunks_clean"] > 0, result
    assert result["queue_left"] == 0 and result["parked"] == 0 and result["recovery_s"] is not None, result


@pytest.mark.ray
async def test_the_sidecar_held_at_twice_its_capacity_sheds_cleanly(sidecar_url: str) -> None:
    result = await sidecar_overload(sidecar_url, TEXT_MODEL, seconds=2.0, factor=2.0)
    assert result["sent"] > 0 and result["served"] > 0, result
    assert result["server_errors"] == 0 and result["problems"] == {}, result  # shed: coded, Retry-After
    assert result["served"] + result["shed"] == result["sent"] and result["served_after"], result
    rss = result["rss_mb"]
    assert rss["before"] is not None and rss["max"] < 2 * rss["before"] + 256, result


async def test_the_gateway_under_64_mixed_callers_fails_no_request(
    database_url: str, sidecar_url: str
) -> None:
    async with running_gateway(database_url, sidecar_url) as gw:
        await gw.ingest(DESCRIPTORS, corpus_records())

        def record(n: int) -> dict:
            return {
                "section_tipo": "rsc1",
                "section_id": 1000 + n,
                "projects": [1],
                "groups": {"card": {"lg-eng": f"Card {n}."}},
            }

        result = await gateway_mixed_load(
            gw.url,
            ADMIN,
            callers=64,
            seconds=2.0,
            section_tipo="oh1",
            ingest_record=record,
        )
    assert all(c["requests"] > 0 for c in result["classes"].values()), result
    assert result["failed"] == 0, result


def test_the_report_has_a_row_for_every_fault_figure() -> None:
    """The figures each fault returns are the ones the REPORT table reads (a missing key broke a run)."""
    from benchmarks.reliability_figures import fault_figures

    drain = {
        "records": 4, "queued_when_stopped": 3, "seconds_down": 1.0, "records_lost": 0, "chunks": 4,
        "chunks_clean": 4, "records_differing": [], "max_vector_difference": 0.0, "queue_left": 0, "parked": 0,
        "drain_crashes": 0, "recovery_s": 1.0,
    }  # fmt: skip
    killed = {
        "model": "m", "callers": 2, "replicas": 1, "requests": 9, "requests_after_kill": 3,
        "failed_after_retries": 0, "statuses": {"200": 9}, "server_errors": 0, "dropped": 0, "hung_callers": 0,
        "slowest_request_s": 1.0, "replaced_s": 2.0, "first_ok_after_kill_s": 1.0, "recovered_s": 0.5,
        "p99_after_kill_s": 1.0, "slowest_coded_answer_s": 1.0,
    }  # fmt: skip
    result = {
        "postgres_stopped": drain,
        "sidecar_stopped": {**drain, "queued_when_restarted": 2, "drain_states_while_down": ["paused"]},
        "drain_worker_killed": {
            "records": 4, "workers": 3, "lease_s": 3.0, "queued_at_kill": 3, "orphaned_records": 2, "records_lost": 0,
            "duplicate_rows": 0, "chunks": 4, "chunks_clean": 4, "records_differing": [], "max_vector_difference": 0.0,
            "queue_left": 0, "surviving_workers": 2, "orphans_indexed_s": 3.5, "drained_s": 4.0,
        },
        "replica_killed": killed,
        "replica_killed_of_two": {**killed, "replicas": 2},
        "overload": {
            "model": "m", "texts_per_request": 16, "capacity_rps": 1.0, "offered_rps": 2.0, "held_s": 3.0, "sent": 6,
            "not_sent_client_bound": 0, "statuses": {"200": 6}, "served": 6, "shed": 0, "server_errors": 0,
            "problems": {}, "rss_mb": {"before": 1.0, "max": 1.0, "after": 1.0}, "served_after": True,
        },
        "mixed_load": {"callers": 2, "seconds": 1.0, "classes": {"retrieve": {"requests": 1, "failed": 0,
                       "failed_by_status": {}, "p50_ms": 1.0, "p99_ms": 2.0}}, "failed": 0, "records_pushed": 0},
    }  # fmt: skip
    rows = fault_figures(result)
    assert len(rows) == 4 + 4 + 3 + 5 + 2 + 4 + 1 and all(len(row) == 3 for row in rows)
    assert fault_figures({"overload": {"error": "RuntimeError: x"}})[0][1] == "RuntimeError: x"
