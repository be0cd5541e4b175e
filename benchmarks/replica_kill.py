"""A Ray Serve model replica of the sidecar killed under load (the reliability suite's replica rows):
closed-loop ``/embed`` callers keep sending while a replica actor is killed; every request must end
in a 200 or a coded retryable answer, none dropped or hung, and the time to a new replica is counted.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from inference.launcher import APP_NAME

from .fuzz import error_code
from .measure import percentile

__all__ = ["live_replicas", "replica_killed_under_load"]


def live_replicas(deployment: str, app: str = APP_NAME) -> list[tuple[str, str]]:
    """(name, namespace) of the live replica actors of application ``app``'s Serve deployment (this
    process's Ray). An actor's name is ``SERVE_REPLICA::<app>#<deployment>#<id>``."""
    from ray.util import list_named_actors

    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    return [
        (a["name"], a["namespace"])
        for a in list_named_actors(all_namespaces=True)
        if a["name"].startswith(prefix)
    ]


def _embed_once(conn: http.client.HTTPConnection, body: bytes) -> tuple[str, int, float]:
    """("ok" | "coded" | "server_error" | "dropped", status, Retry-After seconds) for one ``/embed``."""
    try:
        conn.request("POST", "/embed", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        payload = response.read()
    except (OSError, http.client.HTTPException):
        conn.close()
        return "dropped", 0, 0.0
    if response.status == 200:
        return "ok", 200, 0.0
    retry_after = response.getheader("Retry-After")
    if error_code(payload) and retry_after and response.status in (429, 503):
        return "coded", response.status, float(retry_after)
    return "server_error", response.status, 0.0


class _Tally:
    """What the callers met, shared between their threads (under one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: dict[str, int] = {}
        self.requests = {"sent": 0, "ok": 0, "failed": 0, "after_kill": 0, "failed_after_kill": 0}
        self.first_ok_after_kill: list[float] = []
        self.last_refusal: list[float] = []  # when a request last met something other than 200
        self.slowest = 0.0  # the longest a request took, its retries included
        self.after_kill_s: list[float] = []  # how long each request that finished after the kill took
        self.coded_attempts_s: list[float] = []  # each attempt after the kill, to its coded 429/503

    def attempt(self, outcome: str, status: int, took: float, after_kill: bool) -> None:
        with self.lock:
            if outcome == "coded" and after_kill:
                self.coded_attempts_s.append(took)
            key = str(status) if status else "no answer"
            self.statuses[key] = self.statuses.get(key, 0) + 1
            if outcome != "ok" and after_kill:
                self.last_refusal[:] = [time.monotonic()]

    def request(self, outcome: str, took: float, after_kill: bool) -> None:
        with self.lock:
            self.requests["sent"] += 1
            self.requests["after_kill"] += after_kill
            self.slowest = max(self.slowest, took)
            if after_kill:
                self.after_kill_s.append(took)
            if outcome == "ok":
                self.requests["ok"] += 1
                if after_kill and not self.first_ok_after_kill:
                    self.first_ok_after_kill.append(time.monotonic())
            else:
                self.requests["failed"] += 1
                self.requests["failed_after_kill"] += after_kill


def _caller(
    address: tuple[Any, Any], body: bytes, tally: _Tally, events: tuple[threading.Event, threading.Event],
    retry_budget: float, timeout_s: float,
) -> None:  # fmt: skip
    """One closed-loop caller until ``stop``: each request retried on a coded 429/503 (honouring
    ``Retry-After``, at most 1 s apart) for up to ``retry_budget`` seconds."""
    stop, killed = events
    conn = http.client.HTTPConnection(*address, timeout=timeout_s)
    try:
        while not stop.is_set():
            started = time.monotonic()
            outcome = "dropped"
            while True:
                attempt_started = time.monotonic()
                outcome, status, wait = _embed_once(conn, body)
                tally.attempt(outcome, status, time.monotonic() - attempt_started, killed.is_set())
                if outcome != "coded" or time.monotonic() - started >= retry_budget:
                    break
                time.sleep(min(wait, 1.0))
            # finished after the kill (in flight at it, or sent later)
            tally.request(outcome, time.monotonic() - started, killed.is_set())
    finally:
        conn.close()


def _replaced_at(
    deployment: str, app: str, before: list[tuple[str, str]], killed_at: float, deadline_s: float,
    after_recovery_s: float,
) -> float | None:  # fmt: skip
    """When Serve ran a replica that was not there before the kill (as many as before), then
    ``after_recovery_s`` more of load; None when not within ``deadline_s`` of the kill."""
    replaced_at = None
    while time.monotonic() < killed_at + deadline_s:
        live = live_replicas(deployment, app)
        if replaced_at is None and any(r not in before for r in live) and len(live) >= len(before):
            replaced_at = time.monotonic()
        if replaced_at is not None and time.monotonic() > replaced_at + after_recovery_s:
            break
        time.sleep(0.1)
    return replaced_at


def replica_killed_under_load(
    sidecar_url: str,
    model: str,
    *,
    callers: int = 4,
    warm_s: float = 1.0,
    after_recovery_s: float = 2.0,
    deadline_s: float = 180.0,
    retry_for_s: float | None = None,
    timeout_s: float = 60.0,
    app: str = APP_NAME,
) -> dict[str, Any]:
    """``callers`` closed-loop ``/embed`` callers; after ``warm_s`` one replica of ``model`` is killed
    (``ray.kill``, in the process that runs the sidecar's Ray). Each request is retried on a coded
    429/503 (honouring ``Retry-After``, at most 1 s apart), as the sidecar client does, for up to
    ``retry_for_s`` (default ``deadline_s``, the time Serve is given to replace the replica: what is
    asserted is that every request ends well, not how soon; a loaded machine took over 30 s).
    Counted: every answer per status, requests failed after their retries, 500s, drops and hangs
    (no answer in ``timeout_s``), and the time from the kill until a new replica serves."""
    import ray

    from inference.serve_app import deployment_name

    deployment = deployment_name(model)
    before = live_replicas(deployment, app)
    if not before:
        raise RuntimeError(f"no live replica of {deployment} in this process's Ray")
    parts = urlsplit(sidecar_url)
    retry_budget = deadline_s if retry_for_s is None else retry_for_s
    body = json.dumps({"model": model, "input": ["The reservoir flooded the valley."]}).encode()
    stop, killed, tally = threading.Event(), threading.Event(), _Tally()
    args = ((parts.hostname, parts.port), body, tally, (stop, killed), retry_budget, timeout_s)
    threads = [threading.Thread(target=_caller, args=args, daemon=True) for _ in range(callers)]
    for thread in threads:
        thread.start()
    time.sleep(warm_s)
    name, namespace = before[0]
    killed_at = time.monotonic()
    killed.set()
    ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
    replaced_at = _replaced_at(deployment, app, before, killed_at, deadline_s, after_recovery_s)
    stop.set()
    for thread in threads:  # a caller may be inside its retries, or one unanswered attempt, when stop is set
        thread.join(retry_budget + timeout_s + 5)
    statuses, requests = tally.statuses, tally.requests
    return {
        "model": model,
        "callers": callers,
        "replicas": len(before),
        "requests": requests["sent"],
        "requests_after_kill": requests["after_kill"],
        "failed_after_retries": requests["failed"],
        "statuses": dict(sorted(statuses.items())),
        "server_errors": sum(v for k, v in statuses.items() if k not in ("200", "429", "503", "no answer")),
        "dropped": statuses.get("no answer", 0),
        "hung_callers": sum(t.is_alive() for t in threads),
        "slowest_request_s": round(tally.slowest, 2),
        # requests that finished after the kill, their retries included
        "p99_after_kill_s": round(percentile(tally.after_kill_s, 99), 2) if tally.after_kill_s else None,
        # the longest one attempt waited for its coded 429/503 after the kill (the replica wait)
        "slowest_coded_answer_s": round(max(tally.coded_attempts_s), 2) if tally.coded_attempts_s else None,
        # from the kill until Serve runs a new replica; None: not within the deadline
        "replaced_s": None if replaced_at is None else round(replaced_at - killed_at, 2),
        "first_ok_after_kill_s": round(tally.first_ok_after_kill[0] - killed_at, 2)
        if tally.first_ok_after_kill
        else None,
        # from the kill to the last answer other than 200 (0: no caller noticed the kill)
        "recovered_s": round(max(0.0, tally.last_refusal[0] - killed_at), 2) if tally.last_refusal else 0.0,
    }
