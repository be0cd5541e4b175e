"""The Ray Serve application: one deployment per model behind one HTTP ingress.

The ingress answers HTTP two ways. Given ``listen`` (what ``mnemo sidecar`` does), it runs its own
aiohttp front (:func:`~inference.local_server.start_front`) on that address and Serve's HTTP proxy is
left off: one process between the client and the model replicas. Without it (``serve run`` /
``serve deploy`` of ``inference/serve_config.yaml`` on a cluster), Serve's proxies route to
:meth:`Ingress.__call__`. Both paths share one :class:`~inference.api.SidecarAPI` on the replica's
event loop, so their ``/embed`` calls bundle together.

Deployments are thin: :class:`ModelDeployment` wraps a Ray-free :class:`~inference.service.ModelService`
(load, warm up at the largest batch, batch, answer) and :class:`Ingress` wraps the Ray-free
:class:`~inference.api.SidecarAPI`. Scale-out (replicas, fractional CPUs/GPUs, autoscaling) comes from
the model config or a Serve config file (``inference/serve_config.yaml``)::

    serve run inference.serve_app:app_builder config=inference/models.yaml
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ray import exceptions as ray_errors
from ray import serve
from ray.serve import exceptions as serve_errors
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from starlette.requests import Request
from starlette.responses import Response

from .api import SidecarAPI, read_body
from .coalesce import CallCoalescer
from .config import Limits, ModelSpec, SidecarConfig, config_from_dict, load_config
from .errors import NotReady, Overloaded, SidecarApiError
from .local_server import start_front
from .settings import SidecarSettings, load_settings

__all__ = ["HandleBackend", "Ingress", "ModelDeployment", "app_builder", "build_app", "deployment_name"]

INGRESS_NAME = "ingress"
NODE_ID_LABEL = "ray.io/node-id"  # the label Ray puts on every node (its node id)

# The bounded replica wait (HandleBackend._on_a_replica) awaits a response's assignment to a replica
# through this private step of Ray's: a Ray without it fails here, by name, not at the first call.
if not hasattr(DeploymentResponse, "_fetch_future_result_async"):
    raise ImportError("this Ray's DeploymentResponse has no _fetch_future_result_async: tested with ray 2.60")


def deployment_name(model_id: str) -> str:
    return f"model-{model_id}"


@serve.deployment
class ModelDeployment:
    """One model replica. The constructor loads and warms up, so an out-of-memory error fails the boot."""

    def __init__(self, spec: dict[str, Any], limits: dict[str, Any]) -> None:
        from .service import ModelService  # torch loads here, never in the ingress

        self.service = ModelService(ModelSpec(**spec), Limits(**limits))
        self.service.warm_up()

    async def embed(self, texts: list[str], *, truncate: bool, return_sparse: bool) -> dict[str, Any]:
        return await self.service.embed(texts, truncate=truncate, return_sparse=return_sparse)

    async def embed_many(
        self, groups: list[list[str]], *, truncate: bool, return_sparse: bool
    ) -> list[dict[str, Any] | SidecarApiError]:
        return await self.service.embed_many(groups, truncate=truncate, return_sparse=return_sparse)

    async def embed_texts(self, texts: list[str], *, truncate: bool) -> dict[str, Any]:
        return await self.service.embed_texts(texts, truncate=truncate)

    async def embed_images(self, images: list[bytes]) -> dict[str, Any]:
        return await self.service.embed_images(images)

    async def rerank(
        self, query: str, documents: list[str], *, truncate: bool, raw_scores: bool
    ) -> dict[str, Any]:
        return await self.service.rerank(query, documents, truncate=truncate, raw_scores=raw_scores)

    async def tokenize(self, texts: list[str]) -> list[int]:
        return await self.service.tokenize(texts)

    async def info(self) -> dict[str, Any]:
        return self.service.info()

    async def is_ready(self) -> bool:
        return self.service.is_ready()

    async def stats(self) -> dict[str, Any]:
        return self.service.stats()

    async def check_health(self) -> None:
        """Serve's health probe: a dead batching loop fails the replica, which Serve then replaces."""
        if not self.service.healthy():
            raise RuntimeError(f"model {self.service.spec.id}: batching loop stopped")


# A replica that died (killed, out of memory, its node lost) under a call. Every model method is a
# pure function of its arguments, so the call runs again: Serve's router has dropped the dead
# replica and sends it to another live one, or holds it until the replica wait runs out.
_REPLICA_GONE = (
    serve_errors.ReplicaUnavailableError,
    ray_errors.ActorDiedError,
    ray_errors.ActorUnavailableError,
)
_GONE_RETRIES = 2


class HandleBackend:
    """Adapts a Serve ``DeploymentHandle`` to :class:`~inference.backends.Backend`, unwrapping Ray's errors.

    ``/embed`` calls that arrive while others are in flight travel to the replica together
    (:class:`~inference.coalesce.CallCoalescer`): one Ray round trip per bundle, not per request.

    Fail fast: a call no replica takes within ``replica_wait_s`` answers 503 ``not_ready`` with
    ``Retry-After`` instead of waiting for a replacement replica to warm up; a call whose replica
    died under it runs again on another replica (at most :data:`_GONE_RETRIES` times).
    """

    def __init__(
        self,
        handle: DeploymentHandle,
        model_id: str,
        *,
        bundles_in_flight: int = 2,
        replica_wait_s: float,
    ) -> None:
        self.handle = handle
        self.model_id = model_id
        self.replica_wait_s = replica_wait_s
        self._embeds: CallCoalescer[list[str]] | None = (
            # A bundle no replica took fails the calls queued behind it at once, so none of them waits
            # longer than replica_wait_s for its 503.
            CallCoalescer(self._embed_bundle, max_in_flight=bundles_in_flight, shared_failures=(NotReady,))
            if bundles_in_flight
            else None
        )

    def _not_ready(self, why: str) -> NotReady:
        return NotReady(f"model {self.model_id!r}: {why}", retry_after=max(1.0, self.replica_wait_s))

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        for attempt in range(_GONE_RETRIES + 1):
            try:
                return await self._on_a_replica(method, args, kwargs)
            except ray_errors.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, BaseException):
                    raise cause from None
                raise
            except serve_errors.BackPressureError as exc:
                raise Overloaded(f"model {self.model_id!r}: too many requests queued", retry_after=1) from exc
            except serve_errors.DeploymentUnavailableError as exc:
                raise self._not_ready("the deployment is not available") from exc
            except _REPLICA_GONE as exc:
                if attempt == _GONE_RETRIES:
                    raise self._not_ready(f"its replicas died under {attempt + 1} tries") from exc
        raise AssertionError("unreachable: the loop returns or raises")

    async def _on_a_replica(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        response = getattr(self.handle, method).remote(*args, **kwargs)
        # Resolving the response's replica is the router's assignment step, where a call waits for a
        # live replica with room. Ray names it privately (checked at import, tested with 2.60); the wait is bounded here.
        assigned = asyncio.ensure_future(response._fetch_future_result_async())
        try:
            await asyncio.wait_for(asyncio.shield(assigned), self.replica_wait_s)
        except TimeoutError:
            response.cancel()  # unassigned: the router forgets it, no replica ever runs it
            assigned.cancel()
            raise self._not_ready(
                f"no replica took the call within {self.replica_wait_s:g} s "
                "(none live while a replacement starts, or all busy)"
            ) from None
        return await response

    async def embed(self, texts, *, truncate, return_sparse):
        if self._embeds is None:
            return await self._call("embed", texts, truncate=truncate, return_sparse=return_sparse)
        return await self._embeds.call((truncate, return_sparse), texts)

    async def _embed_bundle(self, options: Any, groups: list[list[str]]) -> list[Any]:
        truncate, return_sparse = options
        return await self._call("embed_many", groups, truncate=truncate, return_sparse=return_sparse)

    async def embed_texts(self, texts, *, truncate):
        return await self._call("embed_texts", texts, truncate=truncate)

    async def embed_images(self, images):
        return await self._call("embed_images", images)

    async def rerank(self, query, documents, *, truncate, raw_scores):
        return await self._call("rerank", query, documents, truncate=truncate, raw_scores=raw_scores)

    async def tokenize(self, texts):
        return await self._call("tokenize", texts)

    async def info(self):
        return await self._call("info")

    async def is_ready(self):
        return await self._call("is_ready")

    async def stats(self):
        return await self._call("stats")

    def coalescing(self) -> dict[str, int] | None:
        if self._embeds is None:
            return None
        return {"calls": self._embeds.calls, "bundles": self._embeds.bundles}


_INGRESS_CPUS = 0.1


@serve.deployment(ray_actor_options={"num_cpus": _INGRESS_CPUS}, max_ongoing_requests=1024)
class Ingress:
    """The one HTTP entry point: reads the body within the byte limit and hands it to the API."""

    # Serve runs an async constructor on the replica's user-code event loop, where __call__ runs too:
    # the front's server lives on that loop.
    async def __init__(  # type: ignore[misc]
        self,
        config: dict[str, Any],
        handles: dict[str, DeploymentHandle],
        api_key: str | None,
        listen: dict[str, Any] | None = None,
    ) -> None:
        cfg = config_from_dict(config, environ={})
        backends = {
            model: HandleBackend(
                handle,
                model,
                bundles_in_flight=cfg.model(model).bundles_in_flight,
                replica_wait_s=cfg.limits.replica_wait_s,
            )
            for model, handle in handles.items()
        }
        self.api = SidecarAPI(cfg, backends, api_key=api_key)
        # A taken port fails the constructor, so the deploy fails naming the address.
        self._front = await start_front(self.api, **listen) if listen else None

    async def check_health(self) -> None:
        """Serve's health probe: a replica that answers HTTP itself is healthy only while it listens,
        so Serve replaces one whose front stopped (and the new replica binds the address again)."""
        if self._front is not None and not self._front.addresses:
            raise RuntimeError("the ingress's HTTP front is not listening")

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        root = request.scope.get("root_path", "")
        if root and root != "/" and path.startswith(root):
            path = path[len(root) :]
        body: bytes | SidecarApiError
        try:
            body = await read_body(
                request.stream(), request.headers.get("content-length"), self.api.max_body_bytes
            )
        except SidecarApiError as exc:
            body = exc
        answer = await self.api.handle(request.method, path, request.headers, body)
        return Response(
            answer.body,
            status_code=answer.status,
            media_type=answer.content_type,
            headers=dict(answer.headers),
        )


def build_app(
    config: SidecarConfig,
    *,
    api_key: str | None = None,
    listen: dict[str, Any] | None = None,
    ingress_node: str | None = None,
) -> serve.Application:
    """The Serve application for ``config``. ``api_key`` defaults to ``RAG_SIDECAR_API_KEY``.

    ``listen`` (``host``, ``port``, ``request_timeout_s``, ``keep_alive_timeout_s``) makes the ingress
    serve HTTP itself on that address, for a Serve started without its proxy (one ingress replica:
    the address is bound once). ``ingress_node`` (a Ray node id) places that replica on the node, so
    on a cluster the address is bound where the caller expects it.
    """
    if api_key is None:
        api_key = load_settings(SidecarSettings).api_key
    limits = config.to_dict()["limits"]
    handles = {}
    for spec in config.models:
        # A fixed replica count, or Serve's autoscaling between min_replicas and max_replicas.
        scaling: dict[str, Any] = (
            {"num_replicas": spec.replicas}
            if spec.autoscaling is None
            else {"autoscaling_config": dict(spec.autoscaling)}
        )
        deployment = ModelDeployment.options(
            name=deployment_name(spec.id),
            **scaling,
            max_replicas_per_node=spec.max_replicas_per_node,
            ray_actor_options={
                "num_cpus": spec.num_cpus,
                "num_gpus": spec.num_gpus,
                "runtime_env": {"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}},
            },
            # At least a batch's worth of requests per replica, or batches never fill; the item
            # bound in the batcher (429) trips before these do.
            max_ongoing_requests=max(spec.max_queued_items, 2 * spec.max_batch_size),
            max_queued_requests=max(spec.max_queued_items, 2 * spec.max_batch_size),
            # Load errors (missing weights, out of memory at warm-up) repeat: fail the deploy soon.
            max_constructor_retry_count=3,
        )
        handles[spec.id] = deployment.bind(spec.public(), limits)
    ingress = Ingress.options(name=INGRESS_NAME)
    if listen is not None:
        ingress = ingress.options(num_replicas=1)
    if ingress_node is not None:
        # Every node carries its id as a label. Not the node's IP resource (``node:<ip>``): several
        # nodes on one host share it, and the replica could land on another node than the caller's.
        ingress = ingress.options(
            ray_actor_options={"num_cpus": _INGRESS_CPUS, "label_selector": {NODE_ID_LABEL: ingress_node}}
        )
    return ingress.bind(config.to_dict(), handles, api_key, listen)


def app_builder(args: dict[str, str]) -> serve.Application:
    """Entry point for ``serve run`` / ``serve deploy``: ``args["config"]`` is the model config path."""
    path = args.get("config") or load_settings(SidecarSettings).config or default_config_path()
    return build_app(load_config(path))


def default_config_path() -> str:
    """The offline profile shipped with the package."""
    return str(os.path.join(os.path.dirname(__file__), "models.offline.yaml"))
