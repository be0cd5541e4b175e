"""``mnemo sidecar``: serve the model config until Ctrl-C, on a local Ray instance (no dashboard) or,
with ``--address``, on an existing Ray cluster whose nodes host the replicas."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    from .config import load_config
    from .launcher import example_requests, running_sidecar
    from .serve_app import default_config_path
    from .settings import SidecarSettings, load_settings

    settings = load_settings(
        SidecarSettings,
        config=args.config,
        host=args.host,
        port=args.port,
        num_cpus=args.num_cpus,
        ray_address=args.address,
    )
    config = load_config(settings.config or default_config_path())
    stop = threading.Event()
    _stop_on_signals(stop)
    with running_sidecar(
        config,
        host=settings.host,
        port=settings.port,
        api_key=settings.api_key,
        num_cpus=settings.num_cpus,
        object_store_mb=settings.object_store_mb,
        log_to_driver=True,
        request_timeout_s=settings.request_timeout_s,
        keep_alive_timeout_s=settings.keep_alive_timeout_s,
        address=settings.ray_address,
    ) as url:
        _stop_on_signals(stop)  # again: ray.init replaced the SIGTERM handler with its own sys.exit
        models = ", ".join(f"{m.id} ({m.kind})" for m in config.models)
        print(f"sidecar ready at {url} serving {models} from {config.source}. Ctrl-C stops it.", flush=True)
        print(example_requests(url, config), flush=True)
        stop.wait()
    print("sidecar stopped", flush=True)
    return 0


def _stop_on_signals(stop: threading.Event) -> None:
    """SIGINT and SIGTERM set ``stop``: the sidecar then stops gracefully (Serve's replicas drained,
    Ray's processes stopped), whichever signal it was (Ctrl-C, docker stop, systemd, `mnemo up`).

    Called again once Ray is up: ``ray.init`` installs its own SIGTERM handler (``sys.exit``), and
    Ray's C++ failure-signal handler, which then sees SIGTERM first, arms a 3 s SIGALRM that aborts
    the process. Under them, a SIGTERM died of SIGABRT mid-shutdown and left Ray's agents running
    for about a minute. (A SIGTERM during the start itself still meets Ray's handlers.)"""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sidecar",
        help="serve the inference sidecar (Ray Serve: local, or on a cluster with --address) in the foreground",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="model config YAML (env RAG_SIDECAR_CONFIG; default: offline)",
    )
    p.add_argument("--host", default=None, help="listen address (env RAG_SIDECAR_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (env RAG_SIDECAR_PORT, default 8001)")
    p.add_argument(
        "--num-cpus", type=float, default=None, help="CPUs Ray may hand out (env RAG_SIDECAR_NUM_CPUS)"
    )
    p.add_argument(
        "--address",
        default=None,
        help="join this Ray cluster (ray://HOST:10001 or HOST:6379) instead of starting a local one "
        "(env RAG_RAY_ADDRESS); replicas go to its nodes, the HTTP front stays on this one",
    )
    p.set_defaults(run=_run)
