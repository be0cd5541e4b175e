"""The reliability suite's report: its run's result (:func:`benchmarks.suite_reliability.run_suite`)
as tables, the figures declared as rows (:mod:`benchmarks.tables`).

Every figure is a count or a time beside its goal (0 server errors, 0 rows leaked, 0 records lost),
read from the one measurement it describes. A new fault is a key in :data:`FAULTS` and its rows: a
fault whose check itself broke shows one error row instead, and one that was skipped shows none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .fuzz import CLASSES
from .report import SuiteResult, Table
from .stack import IMAGE_MODEL
from .tables import Column, Figure, figure_rows, headings, rows

__all__ = ["FAULTS", "as_suite", "fault_figures"]


def _codes(counts: dict[str, int]) -> str:
    """``{"503 rag.media_disabled": 32}`` -> ``32 (503 rag.media_disabled: 32)``; ``0`` when empty."""
    total = sum(counts.values())
    return f"{total} ({', '.join(f'{k}: {v}' for k, v in counts.items())})" if total else "0"


def _fuzz_figures(service: str, contract: str) -> tuple[Figure, ...]:
    def fuzz(r: Mapping[str, Any]) -> Any:
        return r["fuzz"][service]

    return (
        Figure(f"{service} fuzz cases", lambda r: sum(fuzz(r)["cases_per_route"].values())),
        Figure(
            f"{service} fuzz: server errors (no answer, 500, 5xx undocumented for its route or uncoded)",
            lambda r: fuzz(r)["server_errors"],
            0,
        ),
        Figure(
            f"{service} fuzz: documented coded 5xx (kill switch, not ready)",
            lambda r: _codes(fuzz(r)["documented_unavailable_codes"]),
        ),
        Figure(f"{service} fuzz: answers outside {contract}", lambda r: fuzz(r)["contract_violations"], 0),
    )


# Read from the run's whole result.
ATTACKS = (
    *_fuzz_figures("gateway", "envelope v2"),
    *_fuzz_figures("sidecar", "{{error: {{code, message}}}}"),
    Figure("forged tokens sent", "{tokens[tokens]}"),
    Figure("forged tokens not refused (coded 4xx)", lambda r: len(r["tokens"]["not_refused"]), 0),
    Figure("ACL requests (restricted principal and admin)", "{acl[requests]}"),
    Figure(
        "rows the restricted principal read (> 0, or the leak count proves nothing)",
        "{acl[restricted_rows]}",
        "> 0",
    ),
    Figure("rows leaked to the restricted principal", "{acl[rows_leaked]}", 0),
    Figure("forbidden vs missing answers that differ", lambda r: len(r["acl"]["twins_differing"]), 0),
)

IMAGES = (
    Figure("hostile images sent", "{images}"),
    Figure("hostile images: embedded / coded 4xx", "{embedded} / {refused_4xx}"),
    Figure(
        "hostile images: 5xx, no answer or bad vector", lambda f: f["server_errors"] + len(f["problems"]), 0
    ),
)

SIGTERM = (
    Figure("SIGTERM under load ({callers} callers): requests sent before it", "{requests_before_sigterm}"),
    Figure(
        "SIGTERM: sent before it, served / refused (coded 503) / dropped or uncoded",
        "{before_sigterm[ok]} / {before_sigterm[coded]} / {before_sigterm[broken]}",
        "- / - / 0",
    ),
    Figure(
        "SIGTERM: sent after it, served / refused (no connection or coded 503) / dropped or uncoded",
        lambda f: (
            f"{f['after_sigterm']['ok']} / {f['after_sigterm']['refused'] + f['after_sigterm']['coded']} / "
            f"{f['after_sigterm']['broken']}"
        ),
        "- / - / 0",
    ),
    Figure("SIGTERM: gateway exit code / seconds to exit", "{exit_code} / {seconds_to_exit}", "0 / -"),
)


def _drain_stopped(label: str) -> tuple[Figure, ...]:
    """A dependency stopped while the drain indexes (PostgreSQL, the sidecar): the same figures."""
    return (
        Figure(f"{label} mid-drain: records lost of {{records}} (queued at the stop: {{queued_when_stopped}})",
               "{records_lost}", 0),
        Figure(f"{label}: chunks vs the clean run's / largest vector difference",
               "{chunks} / {chunks_clean} / {max_vector_difference:.1e}", "equal / - / -"),
        Figure(f"{label}: queue left / parked", "{queue_left} / {parked}", "0 / 0"),
        Figure(f"{label}: seconds down / seconds from restart to an empty queue", "{seconds_down} / {recovery_s}",
               "- / bounded"),
    )  # fmt: skip


CLUSTER_NODE_LOST = (
    Figure("two-node Ray cluster, {model} with 2 replicas (max 1 per node): replicas placed on",
           lambda f: ", ".join(f["placed_on"]), "node_a, node_b"),
    Figure("worker node killed (SIGKILL of its raylet and workers) under {node_lost[callers]} SidecarClient "
           "callers: failed after retries (of {node_lost[requests]}) / hung callers",
           "{node_lost[failed_after_retries]} / {node_lost[hung_callers]}", "0 / 0"),
    Figure("node killed: 5xx the sidecar answered (retried by the client) / p99 s after the kill / slowest s",
           "{node_lost[server_errors_answered]} / {node_lost[p99_after_kill_s]} / {node_lost[slowest_request_s]}"),
    Figure("node killed: req/s with both nodes / surviving node alone (same run)",
           "{node_lost[rps_before_kill]} / {node_lost[rps_surviving_node]}"),
    Figure("node killed: seconds until 3 s average 80 % of the surviving node's rate / seconds under half "
           "of it after the kill / seconds until Ray lists the node dead",
           "{node_lost[seconds_to_surviving_throughput]} / {node_lost[outage_seconds]} / "
           "{node_lost[node_declared_dead_s]}", "<= 10 / - / -"),
)  # fmt: skip
CLUSTER_REJOINED = (
    Figure("node rejoined: seconds until it runs / until a replica serves on it again",
           "{node_started_s} / {replica_back_s}", "bounded"),
)  # fmt: skip
CLUSTER_AUTOSCALING = (
    Figure("autoscaling (target {autoscaling[target_ongoing_requests]} ongoing, up after "
           "{autoscaling[upscale_delay_s]} s, down after {autoscaling[downscale_delay_s]} s): "
           "seconds from {callers} callers to 2 replicas / from idle back to 1",
           "{scale_up_s} / {scale_down_s}", "1 -> 2 -> 1"),
    Figure("autoscaling: nodes under load / failed requests",
           lambda f: f"{', '.join(f['nodes_under_load'])} / {f['failed_after_retries']}", "node_a, node_b / 0"),
)  # fmt: skip


def _cluster(f: Mapping[str, Any]) -> list[list[Any]]:
    """The worker node killed under load, its rejoining (its own error row when that broke) and
    autoscaling when it ran."""
    out = figure_rows(CLUSTER_NODE_LOST, f)
    back = f["rejoined"]
    if "error" in back:
        return [*out, ["node rejoined: the check itself failed", back["error"], "no error"]]
    out += figure_rows(CLUSTER_REJOINED, back)
    if f.get("autoscaling"):
        out += figure_rows(CLUSTER_AUTOSCALING, f["autoscaling"])
    return out


KILLED = (
    Figure("replica of {model} killed under load ({callers} callers): requests failed after retries (of "
           "{requests})", "{failed_after_retries}", 0),
    Figure("replica killed: 500s / dropped / hung callers", "{server_errors} / {dropped} / {hung_callers}",
           "0 / 0 / 0"),
    Figure("replica killed: answers by status", "{statuses}"),
    Figure("replica killed: seconds to a new replica actor / to the next 200 / slowest request",
           "{replaced_s} / {first_ok_after_kill_s} / {slowest_request_s}"),
    Figure("one replica of one killed: seconds to a coded 503 (longest attempt after the kill)",
           lambda f: f.get("slowest_coded_answer_s"), "<= 2 (issue 14: 12-39 s of holding)"),
)  # fmt: skip

# The faults and the load held, in the report's order: each its result's key and its rows (a tuple
# of figures read from that result, or a function of it for a fault made of several checks).
FAULTS: tuple[tuple[str, tuple[Figure, ...] | Callable[[Mapping[str, Any]], list[list[Any]]]], ...] = (
    ("postgres_stopped", _drain_stopped("PostgreSQL stopped (-m immediate)")),
    ("sidecar_stopped", _drain_stopped("sidecar stopped")),
    ("drain_worker_killed", (
        Figure("1 of {workers} `mnemo drain` processes killed (SIGKILL) holding {orphaned_records} leased "
               "records: records lost / duplicate rows (of {records})", "{records_lost} / {duplicate_rows}",
               "0 / 0"),
        Figure("drain worker killed: seconds until its orphaned records are indexed (lease {lease_s} s) / "
               "until the queue is empty", "{orphans_indexed_s} / {drained_s}", "bounded"),
        Figure("drain worker killed: queue left / surviving workers", "{queue_left} / {surviving_workers}",
               lambda f: f"0 / {f['workers'] - 1}"),
    )),
    ("backfill_killed", (
        Figure("`mnemo backfill` killed (SIGKILL) mid-build ({indexes_built_at_kill} indexes built), then "
               "resumed: records lost / duplicate rows (of {records})", "{records_lost} / {duplicate_rows}",
               "0 / 0"),
        Figure("backfill killed: seconds from the rerun's start to the swap / queue left",
               "{resume_to_done_s} / {queue_left}", "bounded / 0"),
    )),
    ("replica_killed", KILLED),
    ("replica_killed_of_two", (
        Figure("one replica of two of {model} killed ({callers} callers): failed requests (of {requests}) / "
               "p99 s of those after the kill", "{failed_after_retries} / {p99_after_kill_s}", "0 / <= 2"),
        Figure("one of two killed: answers by status / 500s, dropped, hung",
               "{statuses} / {server_errors}, {dropped}, {hung_callers}", "all 200 / 0, 0, 0"),
    )),
    ("cluster", _cluster),
    ("flood", (  # issue 45: principal A floods, B calls at a steady rate
        Figure("one principal flooding at {flood_target_rps:.0f}/s (~10x the measured {capacity_rps:.1f}/s), "
               "another at {b_rate:.1f}/s: B's success (worst pair)", "{b_success:.0%}", "100%"),
        Figure("flood: B's p99 under the flood / its quiet p99 (median of pairs, spread)",
               lambda f: f"{f['b_p99_ratio']:.2f}x ({f['b_p99_ratio_spread'][0]:.2f}-{f['b_p99_ratio_spread'][1]:.2f})",
               "<= 1.5x"),
    )),
    ("read_replica_restarted", (
        Figure("read replica stopped (-m fast) and started under {callers} search loops: searches failed "
               "(of {searches})", "{searches_failed}", 0),
        Figure("read replica: seconds to reads on the primary after the stop / back on the replica after the "
               "start / fallbacks counted / slowest search s",
               "{seconds_to_primary_after_stop} / {seconds_back_on_replica_after_start} / {fallbacks_counted} / "
               "{slowest_search_s}", "bounded / bounded / > 0 / -"),
    )),
    ("overload", (
        Figure("sidecar at 2x capacity ({offered_rps} req/s of {texts_per_request} texts, capacity "
               "{capacity_rps}) for {held_s} s: sent / served / shed (coded, Retry-After)",
               "{sent} / {served} / {shed}"),
        Figure("overload: other 5xx or no answer / answers breaking the contract",
               lambda f: f"{f['server_errors']} / {sum(f['problems'].values())}", "0 / 0"),
        Figure("overload: replica RSS MiB before / max / after", "{rss_mb[before]} / {rss_mb[max]} / {rss_mb[after]}",
               "bounded"),
        Figure("overload: served normally afterwards", "{served_after}", True),
    )),
    ("acl_tantivy", (  # issue 44: the ACL figures must cover the Tantivy engine
        Figure("ACL again through `mnemo gateway --workers {workers}` on RAG_LEXICAL_INDEX=tantivy: requests / "
               "rows the restricted principal read", "{requests} / {restricted_rows}", "- / > 0"),
        Figure("Tantivy engine: rows leaked to the restricted principal / forbidden vs missing answers that differ",
               lambda f: f"{f['rows_leaked']} / {len(f['twins_differing'])}", "0 / 0"),
        Figure("Tantivy engine: lexical searches it served / the SQL leg served instead (by outcome)",
               lambda f: f"{f['engine_searches'].get('hit', 0)} / "
                         f"{_codes({k: v for k, v in f['engine_searches'].items() if k != 'hit'})}",
               "> 0 / -"),
    )),
    ("tantivy_freshness", (  # issue 44: found by the lexical leg within 2 s (p95) with 2 workers
        Figure("record saved through the intake ({records}, one by one; {workers} workers, `mnemo lexical follow` "
               "running): s from its commit until semantic_search returns it by its lexical leg, p50 / p95 / max",
               "{found[p50_s]} / {found[p95_s]} / {found[max_s]}", lambda f: f"- / <= {f['bar_s']:g} / -"),
        Figure("record saved: s from its commit until the writer's committed index holds it, p50 / p95 / max",
               "{indexed[p50_s]} / {indexed[p95_s]} / {indexed[max_s]}", lambda f: f"- / <= {f['bar_s']:g} / -"),
    )),
    ("tantivy_writer_killed", (  # issue 44: kill -9 of the index writer mid-commit
        Figure("`mnemo lexical follow` killed (SIGKILL) {kills} times under a stream of writes "
               "({kills_with_changes_pending} with changes not yet committed), restarted: rows missing from / "
               "duplicated in the index (of {store_rows})", "{missing} / {duplicated}", "0 / 0"),
        Figure("writer killed: rows in the index the store no longer holds / s for the last restart to catch up",
               "{stale} / {catch_up_s}", "0 / bounded"),
    )),
    ("mixed_load", (
        Figure("gateway, {callers} mixed callers: failed requests / worst class p99 ms",
               lambda f: f"{f['failed']} / {max((v['p99_ms'] or 0) for v in f['classes'].values())}", "0 / -"),
    )),
)  # fmt: skip


def fault_figures(result: Mapping[str, Any]) -> list[list[Any]]:
    """Rows of the figures table for the faults and the load held: first an error row for each fault
    whose check broke, then each measured fault's rows (a skipped one has none)."""
    out = [
        [f"{name}: the check itself failed", result[name]["error"], "no error"]
        for name, _ in FAULTS
        if name in result and "error" in result[name]
    ]
    for name, figures in FAULTS:
        f = result.get(name)
        if f and "error" not in f and "skipped" not in f:
            out += figures(f) if callable(figures) else figure_rows(figures, f)
    return out


MIXED = (
    Column("class", "{class}"),
    Column("requests", "{requests}"),
    Column("failed", "{failed}"),
    Column("failed by status", lambda v: v["failed_by_status"] or ""),
    Column("p50 ms", "{p50_ms}"),
    Column("p99 ms", "{p99_ms}"),
)
# the hostile images' and the forged tokens' tables: one row per case
STATUS_CODE = (Column("status", "{status}"), Column("code", lambda v: v["code"] or ""))


def _status_table(title: str, what: str, by_case: Mapping[str, Any]) -> Table:
    return Table(
        title,
        [what, *headings(STATUS_CODE)],
        [[k, *row] for k, row in zip(by_case, rows(STATUS_CODE, by_case.values()), strict=True)],
    )


def _fuzz_tables(fuzz: Mapping[str, Any]) -> list[Table]:
    """Cases per route and per class, and the statuses answered, per service fuzzed."""
    return [
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


def _figures(result: Mapping[str, Any]) -> list[list[Any]]:
    """The figures table: attacks, hostile images, health afterwards, SIGTERM, then the faults."""
    out = figure_rows(ATTACKS, result)
    if "images" in result:
        out += figure_rows(IMAGES, result["images"])
    out += [[f"{name} healthy afterwards", ok, True] for name, ok in result["healthy_after"].items()]
    if "sigterm" in result:
        out += figure_rows(SIGTERM, result["sigterm"])
    return out + fault_figures(result)


NOTES = (
    "Goals are counts, not ratios: 0 server errors, 0 contract violations, 0 rows leaked, 0 forged "
    "tokens accepted. Failing cases are listed in results.json (figures.fuzz.*.examples) for replay.",
    "A server error is no answer, a 500, or a 5xx whose code the route's /openapi.json does not list "
    "for that status (x-error-codes) or that is not in the service's coded error shape. Documented "
    "coded 5xx (503 rag.media_disabled while the media kill switch is off, 501 rag.not_implemented, "
    "a sidecar model not ready) are counted apart; they are answers the contract promises.",
)
CLUSTER_NOTE = (
    "Two-node cluster: two `ray start` nodes on this machine (benchmarks/cluster.py), one CPU each "
    "as Ray sees it but sharing the machine's cores, so the surviving node alone may serve as fast "
    "as both. The sidecar's front runs on node_a (`mnemo sidecar --address`); node_b is killed "
    "with SIGKILL of its process group. Autoscaling times include Serve's own metric cadence "
    "(replicas and handles push every 10 s, averaged over 30 s) and a new replica's load."
)

TANTIVY_FRESHNESS_NOTE = (
    "Tantivy freshness: the engine re-reads from PostgreSQL every change past its index's watermark, so "
    "the gateway's lexical leg finds a saved record once the drain committed it, before the writer "
    "applied it (that time is bound by the search's 50 ms poll); the writer's own lag is the second row. "
    "Both are timed from the record's change rows' changed_at, taken inside the drain's transaction: "
    "a little before its commit, so the figures err long."
)


def _notes(result: Mapping[str, Any]) -> list[str]:
    fuzz = result["fuzz"]
    notes = [
        *NOTES,
        *(
            f"{s} fuzz stopped at its deadline before every route had its cases."
            for s in fuzz
            if fuzz[s]["stopped_early"]
        ),
    ]
    if "postgres_stopped" in result and "replica_killed" not in result:
        notes.append(
            "Replica kill skipped: the sidecar was given by URL, so its Ray is out of this process's reach."
        )
    if "images" not in result:
        notes.append(f"Hostile images skipped: the sidecar serves no {IMAGE_MODEL}.")
    if "cluster" in result and "error" not in result["cluster"]:
        notes.append(CLUSTER_NOTE)
    if "tantivy_freshness" in result and "error" not in result["tantivy_freshness"]:
        notes.append(TANTIVY_FRESHNESS_NOTE)
    return notes


def as_suite(result: dict[str, Any]) -> SuiteResult:
    """The suite's report from its run's result (which it keeps whole as the figures)."""
    tables = [
        Table("Reliability figures", ["figure", "value", "goal"], _figures(result)),
        *_fuzz_tables(result["fuzz"]),
    ]
    mixed = result.get("mixed_load")
    if mixed is not None and "error" not in mixed:
        tables.append(
            Table(
                f"Gateway under {mixed['callers']} mixed callers for {mixed['seconds']:g} s",
                headings(MIXED),
                rows(MIXED, ({**v, "class": c} for c, v in mixed["classes"].items())),
            )
        )
    if "images" in result:
        tables.append(_status_table("Hostile images on /image", "image", result["images"]["by_image"]))
    tables.append(_status_table("Forged tokens", "token", result["tokens"]["by_token"]))
    return SuiteResult("reliability", tables=tables, figures=result, notes=_notes(result))
