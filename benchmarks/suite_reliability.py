"""The reliability suite: fuzzing both services from their ``/openapi.json``, auth and ACL attacks,
hostile images, and the services' health afterwards. Figures are counts with a goal (0 server
errors, 0 rows leaked, 0 forged tokens accepted), not ratios: a table per part, and every failing
case's description in ``results.json`` so it can be replayed as a regression test.

The gateway runs as a ``mnemo gateway`` subprocess over a fresh database holding a small corpus
pushed through its own intake routes; the sidecar is the run's shared one (with a tiny SigLIP for
``/image``). Every loop is bounded by a case count and a deadline, and targets loopback only.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import secrets
import urllib.request
from typing import Any

from .attacks import AclProbe, bad_images, forged_tokens, image_attacks, leak_check, post_json, token_attacks
from .fuzz import CLASSES, fuzz_service, gateway_contract, sidecar_contract
from .plan import ReliabilityPlan
from .report import SuiteResult, Table
from .stack import BENCH_MODEL, IMAGE_MODEL, BenchStack

__all__ = ["DESCRIPTORS", "corpus_records", "run_suite"]

DESCRIPTORS = {
    "oh1": {
        "embed": [{"id": "card", "contributors": ["oh22"]}, {"id": "transcript", "contributors": ["oh23"]}]
    },
    "rsc1": {"embed": [{"id": "card", "contributors": ["rsc140"]}]},
}
_TEXTS = (
    "The reservoir flooded the valley and the families left their farms.",
    "Silver coins of the third century were found near the old mill.",
    "Cuando llegó el agua del pantano tuvimos que marcharnos del pueblo.",
    "A red-figure amphora with a scene of a chariot race.",
)


def corpus_records() -> list[dict[str, Any]]:
    """oh1 1..8 (odd ids in project 1, even in project 2) and rsc1 1..4 (project 1)."""
    out = []
    for i in range(1, 9):
        out.append(
            {
                "section_tipo": "oh1",
                "section_id": i,
                "projects": [1 if i % 2 else 2],
                "groups": {
                    "card": {"lg-eng": f"{_TEXTS[i % 4]} Card {i}."},
                    "transcript": {"lg-spa": f"{_TEXTS[(i + 1) % 4]} Testimonio {i}."},
                },
            }
        )
    for i in range(1, 5):
        out.append(
            {
                "section_tipo": "rsc1",
                "section_id": i,
                "projects": [1],
                "groups": {"card": {"lg-eng": _TEXTS[i % 4]}},
            }
        )
    return out


def _allowed(row: dict[str, Any]) -> bool:
    """The oracle for the restricted principal (projects [1], oh1 read, oh1/oh23 denied), from the data."""
    section_id = row.get("section_id")
    group = str(row.get("component_tipo") or "").removeprefix("rag:")
    return (
        row.get("section_tipo") == "oh1"
        and isinstance(section_id, int)
        and section_id % 2 == 1
        and group != "transcript"
    )


def _probe(admin: str, restricted: str) -> AclProbe:
    scopes: list[Any] = [["oh1", "rsc1"], "oh1", "rsc1", None]
    requests = [
        {
            "dd_api": "dd_rag_api",
            "action": action,
            "options": {"query": query, "limit": 50, **({"section_tipo": scope} if scope else {})},
        }
        for action in ("semantic_search", "retrieve", "get_agent_context", "ask")
        for query in ("reservoir families", "silver coins mill", "amphora chariot")
        for scope in scopes
    ]
    requests += [
        {
            "dd_api": "dd_rag_api",
            "action": "similar_to",
            "options": {"section_tipo": t, "section_id": i, "limit": 50},
        }
        for t, i in (("oh1", 1), ("oh1", 2), ("rsc1", 1))
    ]
    twins = [
        (
            {
                "dd_api": "dd_rag_api",
                "action": action,
                "options": {"section_tipo": tipo, "section_id": forbidden},
            },
            {
                "dd_api": "dd_rag_api",
                "action": action,
                "options": {"section_tipo": tipo, "section_id": 999_999},
            },
        )
        for action in ("similar_to", "similar_objects", "characterize_object")
        for tipo, forbidden in (("oh1", 2), ("rsc1", 1))
    ]
    return AclProbe(admin=admin, restricted=restricted, allowed=_allowed, requests=requests, twins=twins)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.load(response)


def _load_corpus(url: str, admin: str, wait_s: float) -> None:
    """Sections and records through the gateway's intake, then wait for its drain (bounded)."""
    import time

    from .fuzz import Case, send

    for tipo, descriptor in DESCRIPTORS.items():
        headers = (("Content-Type", "application/json"), ("Authorization", f"Bearer {admin}"))
        body = json.dumps(descriptor).encode()
        status, _, answer = send(url, Case("setup", "PUT", "PUT", f"/v1/sections/{tipo}", headers, body), 120)
        if status >= 300:
            raise RuntimeError(f"PUT /v1/sections/{tipo}: {status} {answer[:200]!r}")
    status, answer = post_json(url, "/v1/records", corpus_records(), admin)
    if status >= 300:
        raise RuntimeError(f"POST /v1/records: {status} {answer[:200]!r}")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            url + "/v1/queue/stats", headers={"Authorization": f"Bearer {admin}"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            stats = json.load(response)["data"]
        if stats["failed"]:  # parked records: the corpus the oracle judges is incomplete
            raise RuntimeError(f"the gateway's drain parked {stats['failed']} corpus records: {stats}")
        if stats["pending"] == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the gateway's drain did not index the corpus in {wait_s} s")


def _healthy(gateway_url: str, sidecar_url: str) -> dict[str, bool]:
    out = {}
    for name, url in (("gateway", gateway_url + "/healthz"), ("sidecar", sidecar_url + "/readyz")):
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                out[name] = response.status == 200
        except OSError:
            out[name] = False
    return out


def _run(gateway_url: str, sidecar_url: str, secret: str, plan: ReliabilityPlan) -> dict[str, Any]:
    """Every part, blocking (the gateway is another process; the sidecar is Ray's)."""
    from gateway.auth import issue_token

    admin = issue_token(secret=secret, sub="bench-admin", projects=None, admin=True)
    restricted = issue_token(
        secret=secret, sub="bench-alice", projects=[1], perms={"oh1": 1, "oh1/oh23": 0}, grants=("ask",)
    )
    served = {m["id"]: m for m in _get(sidecar_url + "/models")["models"]}
    budget = {"cases_per_route": plan.cases_per_route, "seconds": plan.seconds}
    # The ACL check first, on the corpus as loaded: the fuzz's valid cases replace descriptors and
    # records, after which the restricted principal could read nothing and "0 rows leaked" meant nothing.
    search = {"dd_api": "dd_rag_api", "action": "semantic_search", "options": {"query": "reservoir"}}
    acl = leak_check(gateway_url, _probe(admin, restricted))
    tokens = token_attacks(gateway_url, forged_tokens(secret), search)
    gateway = fuzz_service(
        gateway_url,
        _get(gateway_url + "/openapi.json"),
        service="gateway",
        contract=gateway_contract,
        headers={"Authorization": f"Bearer {admin}"},
        hints={
            "section_tipo": ["oh1", "rsc1", "zz9"],
            "section_id": [1, 2, 0],
            "query": ["reservoir", "silver coins", "x"],
            "projects": [[1], []],
            "groups": [{"card": {"lg-eng": "A short card about a mill."}}],
        },
        oversize=plan.gateway_oversize_bytes,
        **budget,
    )
    images = [[base64.b64encode(bad_images()["1x1 PNG"]).decode()]] if IMAGE_MODEL in served else []
    sidecar = fuzz_service(
        sidecar_url,
        _get(sidecar_url + "/openapi.json"),
        service="sidecar",
        contract=sidecar_contract,
        headers={},
        hints={"model": [*served, "no-such-model"], **({"images": images} if images else {})},
        oversize=plan.sidecar_oversize_bytes,
        **budget,
    )
    result = {
        "fuzz": {"gateway": gateway.as_dict(), "sidecar": sidecar.as_dict()},
        "tokens": tokens,
        "acl": acl,
    }
    if IMAGE_MODEL in served:
        dimension = int(served[IMAGE_MODEL]["dimension"])
        result["images"] = image_attacks(sidecar_url, IMAGE_MODEL, bad_images(), dimension)
    result["healthy_after"] = _healthy(gateway_url, sidecar_url)
    return result


def _codes(counts: dict[str, int]) -> str:
    """``{"503 rag.media_disabled": 32}`` -> ``32 (503 rag.media_disabled: 32)``; ``0`` when empty."""
    total = sum(counts.values())
    return f"{total} ({', '.join(f'{k}: {v}' for k, v in counts.items())})" if total else "0"


def _fault_figures(result: dict[str, Any]) -> list[list[Any]]:
    """Rows of the figures table for the faults and the load held (an error row when one broke)."""
    rows: list[list[Any]] = []
    for name in (
        "postgres_stopped",
        "sidecar_stopped",
        "drain_worker_killed",
        "backfill_killed",
        "replica_killed",
        "replica_killed_of_two",
        "cluster",
        "read_replica_restarted",
        "overload",
        "mixed_load",
    ):
        if name in result and "error" in result[name]:
            rows.append([f"{name}: the check itself failed", result[name]["error"], "no error"])
    drains = (
        ("postgres_stopped", "PostgreSQL stopped (-m immediate)"),
        ("sidecar_stopped", "sidecar stopped"),
    )
    for name, label in drains:
        f = result.get(name)
        if f and "error" not in f:
            rows += [
                [
                    f"{label} mid-drain: records lost of {f['records']} (queued at the stop: "
                    f"{f['queued_when_stopped']})",
                    f["records_lost"],
                    0,
                ],
                [f"{label}: chunks vs the clean run's / largest vector difference",
                 f"{f['chunks']} / {f['chunks_clean']} / {f['max_vector_difference']:.1e}", "equal / - / -"],
                [f"{label}: queue left / parked", f"{f['queue_left']} / {f['parked']}", "0 / 0"],
                [f"{label}: seconds down / seconds from restart to an empty queue",
                 f"{f['seconds_down']} / {f['recovery_s']}", "- / bounded"],
            ]  # fmt: skip
    f = result.get("drain_worker_killed")
    if f and "error" not in f:
        rows += [
            [f"1 of {f['workers']} `mnemo drain` processes killed (SIGKILL) holding {f['orphaned_records']} "
             f"leased records: records lost / duplicate rows (of {f['records']})",
             f"{f['records_lost']} / {f['duplicate_rows']}", "0 / 0"],
            [f"drain worker killed: seconds until its orphaned records are indexed (lease {f['lease_s']} s) / "
             "until the queue is empty", f"{f['orphans_indexed_s']} / {f['drained_s']}", "bounded"],
            ["drain worker killed: queue left / surviving workers", f"{f['queue_left']} / {f['surviving_workers']}",
             f"0 / {f['workers'] - 1}"],
        ]  # fmt: skip
    f = result.get("backfill_killed")
    if f and "error" not in f:
        rows += [
            [f"`mnemo backfill` killed (SIGKILL) mid-build ({f['indexes_built_at_kill']} indexes built), then "
             f"resumed: records lost / duplicate rows (of {f['records']})",
             f"{f['records_lost']} / {f['duplicate_rows']}", "0 / 0"],
            ["backfill killed: seconds from the rerun's start to the swap / queue left",
             f"{f['resume_to_done_s']} / {f['queue_left']}", "bounded / 0"],
        ]  # fmt: skip
    f = result.get("replica_killed")
    if f and "error" not in f:
        rows += [
            [
                f"replica of {f['model']} killed under load ({f['callers']} callers): requests failed after "
                f"retries (of {f['requests']})",
                f["failed_after_retries"],
                0,
            ],
            ["replica killed: 500s / dropped / hung callers",
             f"{f['server_errors']} / {f['dropped']} / {f['hung_callers']}", "0 / 0 / 0"],
            ["replica killed: answers by status", f["statuses"], ""],
            ["replica killed: seconds to a new replica actor / to the next 200 / slowest request",
             f"{f['replaced_s']} / {f['first_ok_after_kill_s']} / {f['slowest_request_s']}", ""],
            ["one replica of one killed: seconds to a coded 503 (longest attempt after the kill)",
             f.get("slowest_coded_answer_s"), "<= 2 (issue 14: 12-39 s of holding)"],
        ]  # fmt: skip
    f = result.get("replica_killed_of_two")
    if f and "error" not in f:
        rows += [
            [f"one replica of two of {f['model']} killed ({f['callers']} callers): failed requests (of "
             f"{f['requests']}) / p99 s of those after the kill", f"{f['failed_after_retries']} / "
             f"{f['p99_after_kill_s']}", "0 / <= 2"],
            ["one of two killed: answers by status / 500s, dropped, hung",
             f"{f['statuses']} / {f['server_errors']}, {f['dropped']}, {f['hung_callers']}", "all 200 / 0, 0, 0"],
        ]  # fmt: skip
    rows += _cluster_figures(result.get("cluster"))
    f = result.get("read_replica_restarted")
    if f and "error" not in f and "skipped" not in f:
        rows += [
            [f"read replica stopped (-m fast) and started under {f['callers']} search loops: searches failed "
             f"(of {f['searches']})", f["searches_failed"], 0],
            ["read replica: seconds to reads on the primary after the stop / back on the replica after the "
             "start / fallbacks counted / slowest search s",
             f"{f['seconds_to_primary_after_stop']} / {f['seconds_back_on_replica_after_start']} / "
             f"{f['fallbacks_counted']} / {f['slowest_search_s']}", "bounded / bounded / > 0 / -"],
        ]  # fmt: skip
    f = result.get("overload")
    if f and "error" not in f:
        rss = f["rss_mb"]
        rows += [
            [
                f"sidecar at 2x capacity ({f['offered_rps']} req/s of {f['texts_per_request']} texts, capacity "
                f"{f['capacity_rps']}) for {f['held_s']} s: sent / served / shed (coded, Retry-After)",
                f"{f['sent']} / {f['served']} / {f['shed']}",
                "",
            ],
            ["overload: other 5xx or no answer / answers breaking the contract",
             f"{f['server_errors']} / {sum(f['problems'].values())}", "0 / 0"],
            ["overload: replica RSS MiB before / max / after", f"{rss['before']} / {rss['max']} / {rss['after']}",
             "bounded"],
            ["overload: served normally afterwards", f["served_after"], True],
        ]  # fmt: skip
    f = result.get("mixed_load")
    if f and "error" not in f:
        p99 = max((v["p99_ms"] or 0) for v in f["classes"].values())
        rows.append(
            [f"gateway, {f['callers']} mixed callers: failed requests / worst class p99 ms", f"{f['failed']} / {p99}",
             "0 / -"]
        )  # fmt: skip
    return rows


def _cluster_figures(f: dict[str, Any] | None) -> list[list[Any]]:
    """Rows for the two-node cluster: the worker node killed under load, its rejoining, autoscaling."""
    if not f or "error" in f:
        return []
    lost, back, scaling = f["node_lost"], f["rejoined"], f.get("autoscaling")
    rows = [
        [f"two-node Ray cluster, {f['model']} with 2 replicas (max 1 per node): replicas placed on",
         ", ".join(f["placed_on"]), "node_a, node_b"],
        [f"worker node killed (SIGKILL of its raylet and workers) under {lost['callers']} SidecarClient "
         f"callers: failed after retries (of {lost['requests']}) / hung callers",
         f"{lost['failed_after_retries']} / {lost['hung_callers']}", "0 / 0"],
        ["node killed: 5xx the sidecar answered (retried by the client) / p99 s after the kill / slowest s",
         f"{lost['server_errors_answered']} / {lost['p99_after_kill_s']} / {lost['slowest_request_s']}", ""],
        ["node killed: req/s with both nodes / surviving node alone (same run)",
         f"{lost['rps_before_kill']} / {lost['rps_surviving_node']}", ""],
        ["node killed: seconds until 3 s average 80 % of the surviving node's rate / seconds under half "
         "of it after the kill / seconds until Ray lists the node dead", f"{lost['seconds_to_surviving_throughput']}"
         f" / {lost['outage_seconds']} / {lost['node_declared_dead_s']}", "<= 10 / - / -"],
    ]  # fmt: skip
    if "error" in back:
        return [*rows, ["node rejoined: the check itself failed", back["error"], "no error"]]
    rows.append(["node rejoined: seconds until it runs / until a replica serves on it again",
                 f"{back['node_started_s']} / {back['replica_back_s']}", "bounded"])  # fmt: skip
    if scaling:
        rows += [
            [f"autoscaling (target {scaling['autoscaling']['target_ongoing_requests']} ongoing, up after "
             f"{scaling['autoscaling']['upscale_delay_s']} s, down after {scaling['autoscaling']['downscale_delay_s']} s): "
             f"seconds from {scaling['callers']} callers to 2 replicas / from idle back to 1",
             f"{scaling['scale_up_s']} / {scaling['scale_down_s']}", "1 -> 2 -> 1"],
            ["autoscaling: nodes under load / failed requests", f"{', '.join(scaling['nodes_under_load'])} / "
             f"{scaling['failed_after_retries']}", "node_a, node_b / 0"],
        ]  # fmt: skip
    return rows


def _as_suite(result: dict[str, Any]) -> SuiteResult:
    fuzz = result["fuzz"]
    tables = [
        Table(
            "Fuzzing from /openapi.json: cases per route",
            ["service", "route", "cases", "server errors (service total)"],
            [
                [name, route, count, report["server_errors"] if i == 0 else ""]
                for name, report in fuzz.items()
                for i, (route, count) in enumerate(report["cases_per_route"].items())
            ],
        ),
        Table(
            "Fuzzing: cases per class",
            ["class", *fuzz],
            [[c, *(fuzz[s]["cases_per_class"].get(c, 0) for s in fuzz)] for c in CLASSES],
        ),
        Table(
            "Fuzzing: status distribution",
            ["status", *fuzz],
            [
                [status, *(fuzz[s]["statuses"].get(status, 0) for s in fuzz)]
                for status in sorted({k for r in fuzz.values() for k in r["statuses"]}, key=int)
            ],
        ),
    ]
    tokens, acl = result["tokens"], result["acl"]
    figures = [
        ["gateway fuzz cases", sum(fuzz["gateway"]["cases_per_route"].values()), ""],
        [
            "gateway fuzz: server errors (no answer, 500, 5xx undocumented for its route or uncoded)",
            fuzz["gateway"]["server_errors"],
            0,
        ],
        [
            "gateway fuzz: documented coded 5xx (kill switch, not ready)",
            _codes(fuzz["gateway"]["documented_unavailable_codes"]),
            "",
        ],
        ["gateway fuzz: answers outside envelope v2", fuzz["gateway"]["contract_violations"], 0],
        ["sidecar fuzz cases", sum(fuzz["sidecar"]["cases_per_route"].values()), ""],
        [
            "sidecar fuzz: server errors (no answer, 500, 5xx undocumented for its route or uncoded)",
            fuzz["sidecar"]["server_errors"],
            0,
        ],
        [
            "sidecar fuzz: documented coded 5xx (kill switch, not ready)",
            _codes(fuzz["sidecar"]["documented_unavailable_codes"]),
            "",
        ],
        ["sidecar fuzz: answers outside {error: {code, message}}", fuzz["sidecar"]["contract_violations"], 0],
        ["forged tokens sent", tokens["tokens"], ""],
        ["forged tokens not refused (coded 4xx)", len(tokens["not_refused"]), 0],
        ["ACL requests (restricted principal and admin)", acl["requests"], ""],
        [
            "rows the restricted principal read (> 0, or the leak count proves nothing)",
            acl["restricted_rows"],
            "> 0",
        ],
        ["rows leaked to the restricted principal", acl["rows_leaked"], 0],
        ["forbidden vs missing answers that differ", len(acl["twins_differing"]), 0],
    ]
    if "images" in result:
        images = result["images"]
        figures += [
            ["hostile images sent", images["images"], ""],
            ["hostile images: embedded / coded 4xx", f"{images['embedded']} / {images['refused_4xx']}", ""],
            [
                "hostile images: 5xx, no answer or bad vector",
                images["server_errors"] + len(images["problems"]),
                0,
            ],
        ]
    figures += [[f"{name} healthy afterwards", ok, True] for name, ok in result["healthy_after"].items()]
    if "sigterm" in result:
        term = result["sigterm"]
        figures += [
            [
                f"SIGTERM under load ({term['callers']} callers): requests sent before it",
                term["requests_before_sigterm"],
                "",
            ],
            [
                "SIGTERM: sent before it, served / refused (coded 503) / dropped or uncoded",
                "{ok} / {coded} / {broken}".format(**term["before_sigterm"]),
                "- / - / 0",
            ],
            [
                "SIGTERM: sent after it, served / refused (no connection or coded 503) / dropped or uncoded",
                "{} / {} / {}".format(
                    term["after_sigterm"]["ok"],
                    term["after_sigterm"]["refused"] + term["after_sigterm"]["coded"],
                    term["after_sigterm"]["broken"],
                ),
                "- / - / 0",
            ],
            [
                "SIGTERM: gateway exit code / seconds to exit",
                f"{term['exit_code']} / {term['seconds_to_exit']}",
                "0 / -",
            ],
        ]
    figures += _fault_figures(result)
    tables.insert(0, Table("Reliability figures", ["figure", "value", "goal"], figures))
    if "mixed_load" in result and "error" not in result["mixed_load"]:
        mixed = result["mixed_load"]
        tables.append(
            Table(
                f"Gateway under {mixed['callers']} mixed callers for {mixed['seconds']:g} s",
                ["class", "requests", "failed", "failed by status", "p50 ms", "p99 ms"],
                [
                    [c, v["requests"], v["failed"], v["failed_by_status"] or "", v["p50_ms"], v["p99_ms"]]
                    for c, v in mixed["classes"].items()
                ],
            )
        )
    if "images" in result:
        tables.append(
            Table(
                "Hostile images on /image",
                ["image", "status", "code"],
                [[k, v["status"], v["code"] or ""] for k, v in result["images"]["by_image"].items()],
            )
        )
    tables.append(
        Table(
            "Forged tokens",
            ["token", "status", "code"],
            [[k, v["status"], v["code"] or ""] for k, v in tokens["by_token"].items()],
        )
    )
    notes = [
        "Goals are counts, not ratios: 0 server errors, 0 contract violations, 0 rows leaked, 0 forged "
        "tokens accepted. Failing cases are listed in results.json (figures.fuzz.*.examples) for replay.",
        "A server error is no answer, a 500, or a 5xx whose code the route's /openapi.json does not list "
        "for that status (x-error-codes) or that is not in the service's coded error shape. Documented "
        "coded 5xx (503 rag.media_disabled while the media kill switch is off, 501 rag.not_implemented, "
        "a sidecar model not ready) are counted apart; they are answers the contract promises.",
    ]
    notes += [
        f"{s} fuzz stopped at its deadline before every route had its cases."
        for s in fuzz
        if fuzz[s]["stopped_early"]
    ]
    if "postgres_stopped" in result and "replica_killed" not in result:
        notes.append(
            "Replica kill skipped: the sidecar was given by URL, so its Ray is out of this process's reach."
        )
    if "images" not in result:
        notes.append(f"Hostile images skipped: the sidecar serves no {IMAGE_MODEL}.")
    if "cluster" in result and "error" not in result["cluster"]:
        notes.append(
            "Two-node cluster: two `ray start` nodes on this machine (benchmarks/cluster.py), one CPU each "
            "as Ray sees it but sharing the machine's cores, so the surviving node alone may serve as fast "
            "as both. The sidecar's front runs on node_a (`mnemo sidecar --address`); node_b is killed "
            "with SIGKILL of its process group. Autoscaling times include Serve's own metric cadence "
            "(replicas and handles push every 10 s, averaged over 30 s) and a new replica's load."
        )
    return SuiteResult("reliability", tables=tables, figures=result, notes=notes)


def _mixed_record(n: int) -> dict[str, Any]:
    """The n-th record the mixed load pushes (rsc1, ids from 1000, never the corpus's)."""
    text = _TEXTS[n % len(_TEXTS)]
    return {
        "section_tipo": "rsc1",
        "section_id": 1000 + n,
        "projects": [1],
        "groups": {"card": {"lg-eng": text}},
    }


async def _attempt(figures: dict[str, Any], name: str, run: Any) -> None:
    """``figures[name] = await run``; a fault that breaks the harness is recorded, not fatal."""
    try:
        figures[name] = await run
    except Exception as exc:  # the next fault still runs; the report says what broke
        figures[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}


async def _faults(stack: BenchStack, plan: ReliabilityPlan, result: dict[str, Any]) -> None:
    """PostgreSQL stopped hard mid-drain, a drain worker killed, a backfill killed mid-build, the
    sidecar stopped mid-drain, a replica killed, a node of a two-node Ray cluster killed (and
    autoscaling there), overload."""
    from .backfill_fault import backfill_killed_mid_build
    from .faults import (
        drain_worker_killed,
        postgres_stopped_mid_drain,
        replica_killed_under_load,
        sidecar_stopped_mid_drain,
    )
    from .load_held import sidecar_overload
    from .stack import bench_sidecar_config

    assert stack.sidecar_url is not None and stack.server_url is not None
    if plan.faults:
        records = plan.fault_records
        await _attempt(
            result,
            "postgres_stopped",
            postgres_stopped_mid_drain(
                stack.sidecar_url, stack.work_dir, text_model=BENCH_MODEL, records=records
            ),
        )
        await _attempt(
            result,
            "drain_worker_killed",
            drain_worker_killed(
                stack.server_url, stack.sidecar_url, stack.work_dir, text_model=BENCH_MODEL, records=records
            ),
        )
        await _attempt(
            result,
            "backfill_killed",
            backfill_killed_mid_build(
                stack.server_url, stack.sidecar_url, stack.work_dir, text_model=BENCH_MODEL, records=records
            ),
        )
        config = bench_sidecar_config()
        await _attempt(
            result,
            "sidecar_stopped",
            sidecar_stopped_mid_drain(
                stack.server_url, config.model(BENCH_MODEL), config.limits, records=records
            ),
        )
        if _ray_here():
            await _attempt(
                result,
                "replica_killed",
                asyncio.to_thread(replica_killed_under_load, stack.sidecar_url, BENCH_MODEL, callers=4),
            )
            await _attempt(result, "replica_killed_of_two", asyncio.to_thread(_one_of_two_replicas_killed))
    if plan.cluster_callers > 0:
        from .node_loss import cluster_faults

        spec = bench_sidecar_config().model(BENCH_MODEL)
        await _attempt(result, "cluster", cluster_faults(spec, callers=plan.cluster_callers))
    if plan.overload_seconds > 0:
        await _attempt(
            result,
            "overload",
            sidecar_overload(stack.sidecar_url, BENCH_MODEL, seconds=plan.overload_seconds, factor=2.0),
        )


def _one_of_two_replicas_killed() -> dict[str, Any]:
    """The bench model served by two replicas (an application of its own beside the stack's), one
    killed under load: the ingress moves the calls of the dead one to the other."""
    from inference.config import SidecarConfig
    from inference.launcher import running_sidecar

    from .faults import replica_killed_under_load
    from .stack import bench_sidecar_config

    config = bench_sidecar_config()
    # Ray schedules by CPU shares and the stack's app holds most of them: a quarter CPU each lets
    # both replicas start beside it (they still run the bench model's torch threads).
    spec = dataclasses.replace(config.model(BENCH_MODEL), replicas=2, num_cpus=0.25)
    two = SidecarConfig(models=(spec,), limits=config.limits)
    with running_sidecar(two, app_name=_TWO_REPLICAS_APP, api_key="") as url:
        return replica_killed_under_load(url, BENCH_MODEL, callers=4, app=_TWO_REPLICAS_APP)


_TWO_REPLICAS_APP = "mnemo-two-replicas"


def _ray_here() -> bool:
    """Whether this process runs the sidecar's Ray (a sidecar given by URL is out of reach)."""
    import ray

    return bool(ray.is_initialized())


async def run_suite(stack: BenchStack, plan: ReliabilityPlan) -> SuiteResult:
    from .gateway import gateway_process

    assert stack.sidecar_url is not None
    database = await stack.fresh_database("bench_reliability")
    secret = secrets.token_urlsafe(48)
    log = stack.work_dir / "reliability-gateway.log"
    from gateway.auth import issue_token

    admin = issue_token(secret=secret, sub="bench-admin", projects=None, admin=True)
    async with gateway_process(database, stack.sidecar_url, secret, log, text_model=BENCH_MODEL) as gateway:
        await asyncio.to_thread(_load_corpus, gateway.url, admin, plan.seconds)
        mixed: dict[str, Any] = {}
        if plan.mixed_callers > 0:  # first, on the corpus as loaded (the fuzz edits and deletes records)
            from .load_held import gateway_mixed_load

            await _attempt(
                mixed,
                "mixed_load",
                gateway_mixed_load(
                    gateway.url,
                    admin,
                    callers=plan.mixed_callers,
                    seconds=plan.mixed_seconds,
                    section_tipo="oh1",
                    ingest_record=_mixed_record,
                ),
            )
        if plan.mixed_callers > 0:  # issue 45: one principal's flood, another's steady calls
            from .flood import flood_figure

            await _attempt(
                mixed,
                "flood",
                flood_figure(gateway.url, secret, _TEXTS, seconds=plan.mixed_seconds, perms={"oh1": 1}),
            )
        result = {**await asyncio.to_thread(_run, gateway.url, stack.sidecar_url, secret, plan), **mixed}
    if plan.sigterm_callers > 0:
        from .faults import sigterm_under_load

        result["sigterm"] = await asyncio.to_thread(
            sigterm_under_load,
            database,
            stack.sidecar_url,
            secret,
            admin,
            stack.work_dir / "reliability-sigterm.log",
            text_model=BENCH_MODEL,
            callers=plan.sigterm_callers,
        )
    if plan.faults:
        await _read_replica_fault(stack, database, secret, admin, result)
    await _faults(stack, plan, result)
    return _as_suite(result)


async def _read_replica_fault(
    stack: BenchStack, database: str, secret: str, token: str, result: dict[str, Any]
) -> None:
    """A streaming replica of the run's own embedded server: none to make of a ``--database-url`` one."""
    from schema import EmbeddedPostgres

    from .replica_fault import read_replica_restarted

    assert stack.sidecar_url is not None
    if not isinstance(stack.embedded, EmbeddedPostgres):
        result["read_replica_restarted"] = {
            "skipped": "needs the run's embedded PostgreSQL (no --database-url)"
        }
        return
    await _attempt(
        result,
        "read_replica_restarted",
        read_replica_restarted(
            stack.embedded, database, stack.sidecar_url, secret, token, stack.work_dir, text_model=BENCH_MODEL
        ),
    )
