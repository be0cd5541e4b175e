"""A local Ray start whose raylet misses Ray's fixed 30 s registration wait is tried again.

Ray raises "The current node timed out during startup" when its raylet has not registered with
the GCS within 30 s (a 2-core machine running three test suites got there), and leaves the
processes that attempt spawned running. The start stops them and starts again, a bounded number
of times. The late start is injected here (a real one needs a machine slow on demand); every
sidecar test runs the real start.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import psutil
import pytest
import ray

from inference import ray_local

LATE = Exception(
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)


class LateStarts:
    """``ray.init`` that spawns a process (an attempt's GCS and raylet) and is late ``late`` times.

    Only the test's own thread is counted. A thread an earlier test left in this process (Ray's
    auto-init in a Ray Data or Serve helper) may call ``ray.init()`` while ``is_initialized`` is
    patched to False; such a call is kept apart in ``foreign`` and does nothing, so it can neither
    shift the late count nor show up among the start's calls (it did once in CI, as two ``{}``).
    """

    def __init__(self, late: int, error: Exception = LATE) -> None:
        self.late, self.error = late, error
        self.thread = threading.get_ident()
        self.calls: list[dict[str, object]] = []
        self.foreign: list[dict[str, object]] = []
        self.spawned: list[subprocess.Popen[bytes]] = []

    def __call__(self, **options: object) -> None:
        if threading.get_ident() != self.thread:
            self.foreign.append(options)
            return
        self.calls.append(options)
        if len(self.calls) <= self.late:
            self.spawned.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
            raise self.error


@pytest.fixture
def late_ray(monkeypatch: pytest.MonkeyPatch):
    def install(late: int, error: Exception = LATE) -> LateStarts:
        fake = LateStarts(late, error)
        monkeypatch.setattr(ray, "init", fake)
        monkeypatch.setattr(ray, "shutdown", lambda: None)
        return fake

    yield install


def test_a_late_raylet_is_stopped_and_the_start_tried_again(late_ray, caplog) -> None:
    fake = late_ray(late=2)
    ray_local.start_local_ray(include_dashboard=False)
    assert len(fake.calls) == 3 and all(
        c == {"address": "local", "include_dashboard": False} for c in fake.calls
    )
    for proc in fake.spawned:  # each late attempt's processes were stopped before the next
        assert proc.poll() is not None
        assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
    assert sum("Ray start" in r.getMessage() for r in caplog.records) == 2


def test_the_last_late_start_is_raised(late_ray) -> None:
    fake = late_ray(late=ray_local.RAY_START_ATTEMPTS)
    with pytest.raises(Exception, match="timed out during startup"):
        ray_local.start_local_ray()
    assert len(fake.calls) == ray_local.RAY_START_ATTEMPTS


def test_any_other_start_failure_is_raised_at_once(late_ray) -> None:
    fake = late_ray(late=1, error=RuntimeError("object store memory is too small"))
    with pytest.raises(RuntimeError, match="object store"):
        ray_local.start_local_ray()
    assert len(fake.calls) == 1
    fake.spawned[0].kill()
    fake.spawned[0].wait()


def test_a_bulk_jobs_local_ray_is_started_the_same_way(late_ray, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--ray local`` of the backfill and the image job (index.bulk.ray_cluster.connect) retries a late
    raylet as the sidecar does, and starts no dashboard; a process already in a cluster starts none."""
    from index.bulk.ray_cluster import connect

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    fake = late_ray(late=1)
    connect("local")
    assert fake.calls == [{"address": "local", "include_dashboard": False}] * 2
    assert fake.spawned[0].poll() is not None  # the late attempt's processes were stopped
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    connect("local")
    assert len(fake.calls) == 2
