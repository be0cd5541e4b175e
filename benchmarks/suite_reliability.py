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
from .fuzz import fuzz_service, gateway_contract, sidecar_contract
from .gateway import api_request
from .plan import ReliabilityPlan
from .reliability_figures import as_suite
from .report import SuiteResult
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
        api_request(action, query=query, limit=50, **({"section_tipo": scope} if scope else {}))
        for action in ("semantic_search", "retrieve", "get_agent_context", "ask")
        for query in ("reservoir families", "silver coins mill", "amphora chariot")
        for scope in scopes
    ]
    requests += [
        api_request("similar_to", section_tipo=t, section_id=i, limit=50)
        for t, i in (("oh1", 1), ("oh1", 2), ("rsc1", 1))
    ]
    twins = [
        tuple(api_request(action, section_tipo=tipo, section_id=seed) for seed in (forbidden, 999_999))
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


def _tokens(secret: str) -> tuple[str, str]:
    """The admin's token and the restricted principal's (projects [1], oh1 read, oh1/oh23 denied)."""
    from gateway.access.auth import issue_token

    admin = issue_token(secret=secret, sub="bench-admin", projects=None, admin=True)
    restricted = issue_token(
        secret=secret, sub="bench-alice", projects=[1], perms={"oh1": 1, "oh1/oh23": 0}, grants=("ask",)
    )
    return admin, restricted


def _run(gateway_url: str, sidecar_url: str, secret: str, plan: ReliabilityPlan) -> dict[str, Any]:
    """Every part, blocking (the gateway is another process; the sidecar is Ray's)."""
    admin, restricted = _tokens(secret)
    served = {m["id"]: m for m in _get(sidecar_url + "/models")["models"]}
    budget = {"cases_per_route": plan.cases_per_route, "seconds": plan.seconds}
    # The ACL check first, on the corpus as loaded: the fuzz's valid cases replace descriptors and
    # records, after which the restricted principal could read nothing and "0 rows leaked" meant nothing.
    search = api_request("semantic_search", query="reservoir")
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
    from .faults import drain_worker_killed, postgres_stopped_mid_drain, sidecar_stopped_mid_drain
    from .load_held import sidecar_overload
    from .replica_kill import replica_killed_under_load
    from .stack import bench_sidecar_config

    assert stack.sidecar_url is not None and stack.server_url is not None
    server, sidecar, work, records = stack.server_url, stack.sidecar_url, stack.work_dir, plan.fault_records
    config = bench_sidecar_config()
    if plan.faults:
        ingest: dict[str, Any] = {"text_model": BENCH_MODEL, "records": records}
        await _attempt(result, "postgres_stopped", postgres_stopped_mid_drain(sidecar, work, **ingest))
        await _attempt(result, "drain_worker_killed", drain_worker_killed(server, sidecar, work, **ingest))
        await _attempt(result, "backfill_killed", backfill_killed_mid_build(server, sidecar, work, **ingest))
        stopped = sidecar_stopped_mid_drain(server, config.model(BENCH_MODEL), config.limits, records=records)
        await _attempt(result, "sidecar_stopped", stopped)
        if _ray_here():
            killed = asyncio.to_thread(replica_killed_under_load, sidecar, BENCH_MODEL, callers=4)
            await _attempt(result, "replica_killed", killed)
            await _attempt(result, "replica_killed_of_two", asyncio.to_thread(_one_of_two_replicas_killed))
    if plan.cluster_callers > 0:
        from .node_loss import cluster_faults

        cluster = cluster_faults(config.model(BENCH_MODEL), callers=plan.cluster_callers)
        await _attempt(result, "cluster", cluster)
    if plan.overload_seconds > 0:
        overload = sidecar_overload(sidecar, BENCH_MODEL, seconds=plan.overload_seconds, factor=2.0)
        await _attempt(result, "overload", overload)


def _one_of_two_replicas_killed() -> dict[str, Any]:
    """The bench model served by two replicas (an application of its own beside the stack's), one
    killed under load: the ingress moves the calls of the dead one to the other."""
    from inference.config import SidecarConfig
    from inference.launcher import running_sidecar

    from .replica_kill import replica_killed_under_load
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
    from gateway.access.auth import issue_token

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
                flood_figure(
                    gateway.url, secret, _TEXTS, b_rate=4.0, seconds=plan.mixed_seconds, perms={"oh1": 1}
                ),
            )
        if plan.tantivy_records > 0:  # on the corpus as loaded, as the ACL check (the fuzz edits it)
            await _tantivy_engine(stack, database, secret, plan, mixed)
        result = {**await asyncio.to_thread(_run, gateway.url, stack.sidecar_url, secret, plan), **mixed}
    if plan.sigterm_callers > 0:
        from .faults import sigterm_under_load

        result["sigterm"] = await sigterm_under_load(
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
    if plan.tantivy_kills > 0:
        from .tantivy_faults import writer_killed

        kill_database = await stack.fresh_database("bench_tantivy_kill")
        await _attempt(
            result,
            "tantivy_writer_killed",
            writer_killed(kill_database, stack.work_dir, kills=plan.tantivy_kills),
        )
    await _faults(stack, plan, result)
    return as_suite(result)


async def _tantivy_engine(
    stack: BenchStack, database: str, secret: str, plan: ReliabilityPlan, result: dict[str, Any]
) -> None:
    """The ACL check through a 2-worker gateway on the Tantivy engine (with the lexical searches the
    engine served during it: none would leave the leak count proving nothing about the engine),
    then the freshness of records saved through it."""
    from .tantivy_faults import engine_searches, freshness, tantivy_gateway

    assert stack.sidecar_url is not None
    admin, restricted = _tokens(secret)

    async def run() -> dict[str, Any]:
        async with tantivy_gateway(
            database, stack.sidecar_url or "", secret, stack.work_dir, text_model=BENCH_MODEL
        ) as gateway:
            acl = await asyncio.to_thread(leak_check, gateway.url, _probe(admin, restricted))
            searches = await engine_searches(gateway.url, admin)
            await _attempt(
                result,
                "tantivy_freshness",
                freshness(gateway, database, admin, records=plan.tantivy_records),
            )
        return {**acl, "workers": gateway.workers, "engine_searches": searches}

    await _attempt(result, "acl_tantivy", run())


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
