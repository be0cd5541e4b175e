"""A local Ray instance that survives a late raylet: shared by the sidecar's start
(:mod:`inference.launcher`) and the bulk jobs' ``--ray local`` (:mod:`index.bulk.ray_cluster`)."""

from __future__ import annotations

import contextlib
import logging

__all__ = ["RAY_START_ATTEMPTS", "start_local_ray"]

log = logging.getLogger(__name__)

RAY_START_ATTEMPTS = 3
# Ray's own message when its raylet did not register with the GCS within the fixed 30 s it waits
# (ray/_private/node.py); nothing else in a local start says "timed out during startup".
_RAYLET_LATE = "timed out during startup"


def start_local_ray(**options: object) -> None:
    """``ray.init(address="local", **options)``: a fresh instance, never another process's cluster
    found through ``RAY_ADDRESS`` or ``/tmp/ray`` (several test sessions may run side by side).

    Ray waits a fixed 30 s for its raylet to register, and on a loaded machine (a 2-core box running
    three test suites) the raylet can take longer. Such a start is tried again, up to
    :data:`RAY_START_ATTEMPTS` times, each retry logged; the processes the late attempt spawned (its
    GCS and raylet, which Ray leaves running when ``init`` raises) are stopped first. Any other
    failure, and the last late one, is raised as it is.
    """
    import psutil
    import ray

    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        before = {child.pid for child in psutil.Process().children(recursive=True)}
        try:
            ray.init(address="local", **options)
            return
        except Exception as exc:
            if _RAYLET_LATE not in str(exc) or attempt == RAY_START_ATTEMPTS:
                raise
            log.warning(
                "Ray start %d of %d: %s; stopping its processes and starting again",
                attempt,
                RAY_START_ATTEMPTS,
                exc,
            )
            _stop_children_since(before)
            with contextlib.suppress(Exception):
                ray.shutdown()


def _stop_children_since(before: set[int]) -> None:
    """Terminate (then kill) this process's descendants that were not among ``before``."""
    import psutil

    spawned = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    for child in spawned:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(spawned, timeout=10)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
