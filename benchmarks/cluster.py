"""A real Ray cluster of several nodes on this machine, for the cluster tests and the reliability suite.

Each node is a ``ray start ... --block`` subprocess, the head with ``--head`` and the others with
``--address``, each in a process session of its own so that killing that session's process group
takes the node's raylet, its agents and its workers down at once, as a lost machine would. Nodes
share this host's IP (Ray accepts several nodes on one address when every port differs), so each
gets its own ports, its own ``--temp-dir`` (nothing collides with another Ray on the machine: a test
session's local one, another engineer's) and a custom resource named after it (``node_a``,
``node_b``), which is how placement is read. The dashboard is off; the cluster uses token
authentication with a token of its own, passed to every process through the environment.

The sidecar runs on the cluster as ``mnemo sidecar --address`` in a subprocess (:func:`cluster_sidecar`):
the caller of these helpers is often a Ray driver already (a test session's sidecar, a benchmark's
stack), and a process is the driver of one cluster only. Placement is read the same way, by a
driver subprocess that answers questions on its stdin (:meth:`LocalRayCluster.placement`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import json
import logging
import os
import queue
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from inference.config import SidecarConfig
from inference.net import free_port, log_tail, wait_ready

from .settings import child_environment

__all__ = ["FAST_NODE_DEATH", "LocalRayCluster", "ProbeStalled", "cluster_sidecar", "wait_for_placement"]

log = logging.getLogger(__name__)
# The GCS health-checks each raylet every second and declares it dead after 5 failed checks: a killed
# node (its checks refused at once) is noticed in about 5 s instead of Ray's 15-25 (a check every 3 s).
# Each check still waits Ray's 10 s for an answer, so a live node that is merely busy is not declared
# dead: with 2-s timeouts and 3 misses, `make test-stress` lost the head's ingress (most likely a live
# node declared dead).
# For the tests that kill a node; the reliability suite keeps Ray's defaults, the figure an operator gets.
FAST_NODE_DEATH: Mapping[str, object] = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}
_RAY = str(Path(sys.executable).with_name("ray"))
# Ports of one node beyond the head's GCS port: each is distinct per node on a shared IP.
_NODE_PORTS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)
_WORKER_PORTS = 64  # worker processes per node (replicas, the ingress, Serve's controller on the head)


def _free_port_range(count: int) -> int:
    """The first of ``count`` consecutive TCP ports nothing is bound to right now (Ray binds its
    workers on every address)."""
    for _ in range(200):
        start = random.randrange(20_000, 40_000 - count)
        socks: list[socket.socket] = []
        try:
            for port in range(start, start + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("0.0.0.0", port))
            return start
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports found between 20000 and 40000")


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process group ``process`` leads (it was started in a session of its own): a
    node's raylet, agents and workers stay in it after ``ray start`` itself has exited."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(60)
    # The others are reaped by init, not by us: wait until none is left (bounded), so that a killed
    # node is really gone and nothing writes into its directory once it is removed.
    for _ in range(300):
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


@dataclasses.dataclass
class _Node:
    name: str
    head: bool
    args: list[str]
    log: Path
    process: subprocess.Popen | None = None


class LocalRayCluster:
    """A head node (``node_a``) and worker nodes started, killed and restarted by name.

    Use as a context manager: every node this object started is killed on exit and its directory
    removed. ``cpus_per_node`` is each node's CPU count as Ray sees it (it schedules by these; the
    processes share the machine's real cores).
    """

    def __init__(
        self,
        *,
        cpus_per_node: float = 1,
        object_store_mb: int = 80,
        root: Path | None = None,
        system_config: Mapping[str, object] | None = None,
    ) -> None:
        # Short: Ray's unix socket paths live under the temp dir and must stay under 108 bytes.
        self.root = root or Path(tempfile.mkdtemp(prefix="mnemo-rc-", dir="/tmp"))
        self.cpus_per_node = cpus_per_node
        self.object_store_mb = object_store_mb
        # The head's Ray system settings (``ray start --system-config``), e.g. how soon the GCS
        # declares a lost node dead (FAST_NODE_DEATH); Ray's defaults when None.
        self.system_config = dict(system_config or {})
        self.gcs_port = free_port()
        self._ports = {self.gcs_port}  # every port this cluster handed out: none is handed out twice
        self.nodes: dict[str, _Node] = {}
        self._probe: _Probe | None = None
        token = secrets.token_hex(32)
        # Every process of this cluster, drivers included, authenticates with this token.
        self.env = child_environment(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=token,
            RAY_USAGE_STATS_ENABLED="0",
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
        )
        self.env.pop("RAY_ADDRESS", None)  # the cluster's processes find it by flag, never another one

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    def __enter__(self) -> LocalRayCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _port(self) -> int:
        """A free port this cluster has not handed out yet. The OS can return a port again once
        its probe socket is closed, and ``ray start`` refuses two components on one port (a suite
        run lost all eight tries of a start to the GCS's and the client server's being equal)."""
        for _ in range(100):
            port = free_port()
            if port not in self._ports:
                self._ports.add(port)
                return port
        raise RuntimeError("no free port found that this cluster has not handed out already")

    def _worker_ports(self) -> int:
        """The first of :data:`_WORKER_PORTS` free ports, none handed out by this cluster."""
        for _ in range(100):
            first = _free_port_range(_WORKER_PORTS)
            span = set(range(first, first + _WORKER_PORTS))
            if not span & self._ports:
                self._ports |= span
                return first
        raise RuntimeError("no free worker port range found apart from this cluster's ports")

    def _node_args(self, name: str, head: bool) -> list[str]:
        temp_dir = self.root / name
        temp_dir.mkdir(parents=True, exist_ok=True)
        args = [_RAY, "start", "--block", "--disable-usage-stats"]
        if head:
            args += [
                "--head",
                f"--port={self.gcs_port}",
                "--include-dashboard=false",
                f"--dashboard-port={self._port()}",  # its REST API process runs even with the UI off
                f"--ray-client-server-port={self._port()}",
            ]
            if self.system_config:
                args.append(f"--system-config={json.dumps(self.system_config)}")
        else:
            args.append(f"--address={self.address}")
        args += [f"{flag}={self._port()}" for flag in _NODE_PORTS]
        first = self._worker_ports()
        args += [
            f"--min-worker-port={first}",
            f"--max-worker-port={first + _WORKER_PORTS - 1}",
            f"--num-cpus={self.cpus_per_node:g}",
            "--num-gpus=0",
            f"--resources={json.dumps({name: 1})}",
            f"--object-store-memory={self.object_store_mb * 1024 * 1024}",
            f"--temp-dir={temp_dir}",
        ]
        return args

    def start_head(self, name: str = "node_a", timeout_s: float = 300.0) -> None:
        self._start(_Node(name, True, self._node_args(name, head=True), self.root / f"{name}.log"), timeout_s)

    def add_node(self, name: str, timeout_s: float = 300.0) -> None:
        """Start a worker node joining the head; returns once the cluster lists it alive."""
        if not self.nodes:
            raise RuntimeError("start the head node first")
        self._start(
            _Node(name, False, self._node_args(name, head=False), self.root / f"{name}.log"), timeout_s
        )

    def _start(self, node: _Node, timeout_s: float, attempts: int = 8) -> None:
        """Run ``ray start`` for ``node`` until it reports the node started. ``ray start`` gives a
        raylet a fixed 30 s to register with the GCS (hard-coded in ``ray._private.node``); on a
        loaded machine that can run out, so a start that exits before it reports is tried again
        (``attempts`` in all, within ``timeout_s``: a suite run once lost all of three tries). Each
        retry takes fresh ports (the head keeps its GCS port, which the others join at): a port
        that another process took meanwhile would fail every try alike."""
        self.nodes[node.name] = node
        deadline = time.monotonic() + timeout_s
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                node.args = self._node_args(node.name, node.head)
            offset = node.log.stat().st_size if node.log.exists() else 0  # restarts append to the log
            with node.log.open("ab") as out:
                node.process = subprocess.Popen(
                    node.args, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            while time.monotonic() < deadline:
                # ray start prints this once the node's raylet has registered with the head's GCS
                with node.log.open("rb") as log:
                    log.seek(offset)
                    if b"Ray runtime started" in log.read():
                        return
                if node.process.poll() is not None:
                    break
                time.sleep(0.2)
            _kill_group(node.process)  # what the failed start left running
            if time.monotonic() >= deadline or attempt == attempts:
                break
        raise RuntimeError(
            f"ray start for {node.name} did not start the node ({attempts} tries, {timeout_s:g} s):\n"
            f"{log_tail(node.log)}"
        )

    def placement(self, app: str = "", deployment: str | None = None) -> dict[str, Any]:
        """``{"nodes": {name: alive}, "replicas": [{"actor", "node"}]}`` of ``app``'s ``deployment``
        (a live replica is one that answers a call), read by this cluster's probe driver."""
        if self._probe is None:
            self._probe = _Probe(self)
        try:
            return self._probe.ask(app, deployment)
        except ProbeStalled:
            self._probe = None  # killed: the next question starts a fresh driver
            raise

    def kill_node(self, name: str) -> None:
        """SIGKILL the node's whole process group (``ray start``, raylet, agents, workers)."""
        node = self.nodes[name]
        if node.process is None or node.process.poll() is not None:
            raise RuntimeError(f"{name} is not running")
        _kill_group(node.process)

    def restart_node(self, name: str, timeout_s: float = 300.0) -> None:
        """Start a killed worker node again, with the same ports and resources."""
        node = self.nodes[name]
        if node.process is not None and node.process.poll() is None:
            raise RuntimeError(f"{name} is still running")
        self._start(node, timeout_s)

    def stop(self) -> None:
        """Kill every node this object started, the head last, and remove their directories."""
        if self._probe is not None:
            self._probe.close()
            self._probe = None
        for node in reversed(list(self.nodes.values())):
            if node.process is not None:
                _kill_group(node.process)
        shutil.rmtree(self.root, ignore_errors=True)


def _placement(app: str, deployment: str | None) -> dict[str, Any]:
    """What :meth:`LocalRayCluster.placement` answers, computed inside the probe driver."""
    import ray
    from ray.util import list_named_actors

    names = {}  # node id -> its custom resource's name (node_a, node_b, ...)
    alive: dict[str, bool] = {}
    for node in ray.nodes():
        label = next((k for k in node["Resources"] if k.startswith("node_")), None)
        if label is not None:
            names[node["NodeID"]] = label
            alive[label] = alive.get(label, False) or bool(node["Alive"])
    replicas = []
    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    for actor in list_named_actors(all_namespaces=True) if deployment else []:
        if not actor["name"].startswith(prefix):
            continue
        try:
            handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
            # A function run inside the replica's process: the node it really runs on.
            node_id = ray.get(
                handle.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()), timeout=10
            )
        except (ray.exceptions.RayError, ValueError):
            continue  # dead or unreachable: not a live replica
        replicas.append({"actor": actor["name"], "node": names.get(node_id, node_id)})
    return {"nodes": alive, "replicas": replicas}


def probe_main(argv: Sequence[str]) -> int:
    """``python -m benchmarks.cli ray-probe ADDRESS``, the probe driver's loop: one JSON question per
    stdin line, one JSON answer per stdout line."""
    import ray

    (address,) = argv
    ray.init(address=address, namespace="mnemo-probe", log_to_driver=False, configure_logging=False)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        question = json.loads(line)
        # A stalled answer leaves its stack in the probe's log before the parent gives up on it.
        faulthandler.dump_traceback_later(50)
        print(json.dumps(_placement(question["app"], question["deployment"])), flush=True)
        faulthandler.cancel_dump_traceback_later()
    ray.shutdown()
    return 0


class ProbeStalled(RuntimeError):
    """The placement probe gave no answer in time (killed; a later question starts a new one)."""


class _Probe:
    """A driver subprocess of the cluster (the caller may be another cluster's driver already).

    Its stdout is read by a thread into a queue: lines arrive in bursts (Ray may print on a driver's
    stdout too), and a ``select`` on the pipe would miss a line already in the reader's buffer.
    """

    def __init__(self, cluster: LocalRayCluster) -> None:
        self.log = cluster.root / "probe.log"
        with self.log.open("ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.cli", "ray-probe", cluster.address],
                env=cluster.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self._read(120)

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def _read(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                raise ProbeStalled(
                    f"the placement probe gave no answer in {timeout_s:g} s:\n{log_tail(self.log)}"
                ) from None
            if line.startswith("{"):  # anything else is Ray talking on the driver's stdout
                return json.loads(line)

    def ask(self, app: str, deployment: str | None) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"app": app, "deployment": deployment}) + "\n")
        self.process.stdin.flush()
        # A question touches the GCS and every replica; under a dying node or a starved machine a
        # driver could stall, so one that does is replaced rather than waited on.
        return self._read(60)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(60)


def wait_for_placement(
    cluster: LocalRayCluster,
    app: str,
    deployment: str,
    condition: Callable[[dict[str, Any]], bool],
    timeout_s: float,
) -> dict[str, Any]:
    """Poll :func:`placement` until ``condition`` holds on it (returned); TimeoutError with the
    last placement seen otherwise."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            seen = cluster.placement(app, deployment)
        except ProbeStalled as exc:
            log.warning("%s; asking a new probe", exc)
            seen = {"probe": str(exc)[:300]}
            continue
        if condition(seen):
            return seen
        time.sleep(0.5)
    raise TimeoutError(f"placement did not reach the condition in {timeout_s:g} s; last seen: {seen}")


@contextlib.contextmanager
def cluster_sidecar(
    cluster: LocalRayCluster, config: SidecarConfig, *, ready_timeout_s: float = 300.0
) -> Iterator[str]:
    """``mnemo sidecar --address`` serving ``config`` on ``cluster`` (a subprocess: its HTTP front on
    the head node, where the driver attaches); yields its URL, SIGTERM (the app is deleted) on exit."""
    config_path = cluster.root / "sidecar.yaml"
    config_path.write_text(yaml.safe_dump(config.to_dict()), encoding="utf-8")
    log = cluster.root / "sidecar.log"
    port = free_port()
    args = [sys.executable, "-m", "gateway.cli", "sidecar", "--address", cluster.address]
    args += ["--config", str(config_path), "--port", str(port)]
    env = {**cluster.env, "RAG_SIDECAR_API_KEY": ""}
    with log.open("ab") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_ready(url, ready_timeout_s, exit_code=proc.poll)
        except Exception as exc:
            raise RuntimeError(f"the cluster sidecar did not start: {exc}\n{log_tail(log, 40)}") from exc
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(60)
