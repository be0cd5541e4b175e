"""Start the sidecar on a local Ray instance (no dashboard), or on an existing cluster, and stop it again.

Used by ``mnemo sidecar``, ``mnemo up`` and the tests' session fixture. Ray starts inside the calling
process (it becomes the driver), or the process joins a cluster as its driver (``address``). The ingress replica listens on ``host:port`` itself and Serve's HTTP
proxy stays off: a request crosses one process, not two, before its bundle reaches a model replica
(see :mod:`inference.local_server`).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import threading
import time
from collections.abc import Iterator

from .config import SidecarConfig, carry_loop_setting_to_ray, opt_out_of_ray_usage_stats
from .net import free_port, wait_ready
from .ray_local import start_local_ray

__all__ = [
    "SidecarStartTimeout",
    "example_requests",
    "free_port",
    "running_sidecar",
    "start_local_ray",
    "wait_ready",
]

log = logging.getLogger(__name__)
APP_NAME = "mnemo-sidecar"


class SidecarStartTimeout(RuntimeError):
    """The application did not reach RUNNING within the start bound; the message carries Serve's status."""


@contextlib.contextmanager
def running_sidecar(
    config: SidecarConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    num_cpus: float | None = None,
    object_store_mb: int = 256,
    ready_timeout_s: float = 900.0,
    log_to_driver: bool = False,
    request_timeout_s: float = 120.0,
    keep_alive_timeout_s: int = 30,
    address: str | None = None,
    app_name: str = APP_NAME,
) -> Iterator[str]:
    """Run the sidecar for ``config`` and yield its base URL; what this call started stops on exit.

    ``port=0`` picks a free port. ``ready_timeout_s`` bounds the start as a whole (deploy, model
    loads, warm-up, the front answering): past it :class:`SidecarStartTimeout` names what Serve
    was still waiting for, instead of blocking as Serve's own deploy wait does. ``request_timeout_s`` and ``keep_alive_timeout_s`` go to the
    ingress's HTTP front (see :class:`~inference.settings.SidecarSettings`). Missing weights fail before Ray starts (:class:`ModelWeightsMissing`
    naming the path); a model that fails to load or warm up fails here too.

    Where Ray runs: ``address`` (``mnemo sidecar --address``, ``RAG_RAY_ADDRESS``) joins an existing
    cluster, whose nodes host the model replicas; without it a fresh local instance starts, unless
    this process is already a Ray driver (then ``app_name`` is one more application beside the ones
    already deployed). Either way the ingress runs on this process's node and serves HTTP there:
    one front that routes to replicas on every node. On exit the application is deleted; Serve and
    Ray stop only when this call started them (a joined cluster keeps running).
    """
    from .config import resolve_weights

    for spec in config.models:  # fail fast, naming the path, before any Ray process starts
        resolve_weights(spec)

    import ray
    from ray import serve

    from .serve_app import build_app

    port = port or free_port(host)
    started_ray, joined = _attach_ray(address, num_cpus, object_store_mb, log_to_driver)
    served = False
    try:
        # A cluster whose Serve already runs (its proxies included) keeps its options.
        serve.start(proxy_location="Disabled")
        listen = {
            "host": host,
            "port": port,
            "request_timeout_s": request_timeout_s,
            "keep_alive_timeout_s": keep_alive_timeout_s,
        }
        node = ray.get_runtime_context().get_node_id()  # the node this driver attached to
        app = build_app(config, api_key=api_key, listen=listen, ingress_node=node)
        deadline = time.monotonic() + ready_timeout_s
        _deploy(app, app_name, ready_timeout_s)
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
        wait_ready(url, max(1.0, deadline - time.monotonic()))
        served = True
        yield url
    finally:
        _detach_ray(app_name, started_ray=started_ray, joined=joined, drain=served)


def _attach_ray(
    address: str | None, num_cpus: float | None, object_store_mb: int, log_to_driver: bool
) -> tuple[bool, bool]:
    """Make this process a Ray driver: join the cluster at ``address``, start a local instance, or
    keep the one it already drives. Returns ``(started_ray, joined)``: what :func:`_detach_ray` undoes."""
    import ray

    if address is not None:
        if ray.is_initialized():
            raise RuntimeError(
                f"this process is already a Ray driver: it cannot join the cluster at {address}"
            )
        opt_out_of_ray_usage_stats()
        # The cluster is the operator's: no resources or object store are sized from here.
        ray.init(address=address, log_to_driver=log_to_driver, configure_logging=False, **_DRIVER)
        return False, True
    if ray.is_initialized():
        return False, False
    opt_out_of_ray_usage_stats()
    carry_loop_setting_to_ray()
    start_local_ray(
        include_dashboard=False,
        num_cpus=None if num_cpus is None else max(1, round(num_cpus)),
        object_store_memory=object_store_mb * 1024 * 1024,
        log_to_driver=log_to_driver,  # replica logs on this process's stderr (the CLI wants them)
        configure_logging=False,
        **_DRIVER,
    )
    return True, False


def _detach_ray(app_name: str, *, started_ray: bool, joined: bool, drain: bool) -> None:
    """Undo :func:`_attach_ray`: Serve and Ray stop only when this call started them; otherwise the
    application is deleted, and a joined cluster keeps running (this driver only disconnects).
    ``drain``: the application served, so its deletion is awaited (requests in flight finish);
    a start that failed returns at once while Serve deletes what never served (it would otherwise
    wait out a replica that was never placed, about 20 s), unless this driver is about to leave a
    joined cluster: Serve sends the deletion without waiting for it, so it is awaited there."""
    import ray
    from ray import serve

    if started_ray:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        return
    with contextlib.suppress(Exception):
        serve.delete(app_name, _blocking=drain or joined)
    if joined:
        ray.shutdown()


def _deploy(app: object, app_name: str, timeout_s: float) -> None:
    """``serve.run`` with a bound: Serve waits for RUNNING without one (a replica that cannot be
    placed, or a load that is merely slow on a busy machine, would block the caller for good)."""
    from ray import serve

    outcome: list[BaseException | None] = []

    def deploy() -> None:
        try:
            serve.run(app, name=app_name, route_prefix=None)
            outcome.append(None)
        except BaseException as exc:  # handed to the caller's thread below
            outcome.append(exc)

    worker = threading.Thread(target=deploy, name=f"serve-deploy-{app_name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        raise SidecarStartTimeout(
            f"the sidecar application {app_name!r} did not reach RUNNING within {timeout_s:.0f} s; "
            f"Serve reports: {_app_status(app_name)}"
        )
    if outcome[0] is not None:
        raise outcome[0]


def _app_status(app_name: str) -> str:
    from ray import serve

    try:
        app = serve.status().applications.get(app_name)
    except Exception as exc:  # the status is for the message only
        return f"(status unavailable: {exc})"
    if app is None:
        return "no such application yet"
    parts = [f"application {app.status}"]
    for name, deployment in app.deployments.items():
        parts.append(
            f"{name}: {deployment.status} {dict(deployment.replica_states)} {deployment.message}".strip()
        )
    return "; ".join(parts)


_DRIVER = {
    "namespace": "mnemo",
    "runtime_env": {"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}},
}


def _tiny_png_base64() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (180, 60, 40)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def example_requests(url: str, config: SidecarConfig) -> str:
    """Working ``curl`` lines for the served models (one per route kind)."""
    lines = []
    for spec in config.models:
        if spec.kind == "text":
            body = {"model": spec.id, "input": ["a red-figure amphora"]}
            lines.append(f"curl -s {url}/embed -H 'Content-Type: application/json' -d '{json.dumps(body)}'")
        elif spec.kind == "image_text":
            body = {"model": spec.id, "images": [_tiny_png_base64()]}
            lines.append(f"curl -s {url}/image -H 'Content-Type: application/json' -d '{json.dumps(body)}'")
            body = {"model": spec.id, "input": ["a red-figure amphora"]}
            lines.append(f"curl -s {url}/text -H 'Content-Type: application/json' -d '{json.dumps(body)}'")
        elif spec.kind == "rerank":
            body = {"model": spec.id, "query": "amphora", "documents": ["a red-figure amphora", "a coin"]}
            lines.append(f"curl -s {url}/rerank -H 'Content-Type: application/json' -d '{json.dumps(body)}'")
    return "\n".join(lines)
