"""Record intake over HTTP, and the gateway's background drain loop.

Routes (all admin: the archive pushes with a service token):

- ``PUT /v1/sections/{section_tipo}`` stores a section descriptor; ``GET`` reads it back.
- ``POST /v1/records`` (one record or an array) and
  ``DELETE /v1/records/{section_tipo}/{section_id}`` validate, enqueue in one
  transaction and answer 202 Accepted; the drain indexes them.
- ``GET /v1/queue/stats``: pending / ready / blocked / failed / oldest age / leases,
  the drain workers of every process (leases held, records/s), and whether this
  gateway's drain is paused by a sidecar outage. ``POST /v1/queue/retry``
  unparks failed records; ``GET /v1/queue/failed`` lists them with their last error.
- ``GET /v1/sections`` lists every stored descriptor.
- ``POST /v1/sections/{section_tipo}/reconcile`` (``{"ids": [...], "records": [...]}``)
  queues the corrections for the drift between the archive and the index.

The validation and queueing live in :mod:`index.ingest.intake` (shared with
``mnemo ingest records``); this module only maps HTTP onto it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.access.auth import require_admin
from gateway.base.body import read_json
from gateway.base.errors import ApiError, envelope_ok
from gateway.base.resources import METRICS_KEY, POOL_KEY, SETTINGS_KEY, SIDECAR_KEY
from index.ingest import drain_registry, queue
from index.ingest.drain import DrainLoop, stale_after_s
from index.ingest.intake import IntakeError, as_record_list, enqueue_delete, enqueue_records
from index.ingest.metrics import IngestMetrics
from index.ingest.reconcile import reconcile_section
from index.settings import IngestSettings, MediaSettings
from index.store.sections import DescriptorError, SectionStore, validate_section_tipo
from index.store.validation import FieldError, parse_id

__all__ = ["DRAIN_KEY", "INGEST_SETTINGS_KEY", "MEDIA_SETTINGS_KEY", "setup_intake"]

INGEST_SETTINGS_KEY: web.AppKey[IngestSettings] = web.AppKey("ingest_settings", IngestSettings)
DRAIN_KEY: web.AppKey[DrainLoop] = web.AppKey("drain", DrainLoop)
MEDIA_SETTINGS_KEY: web.AppKey[MediaSettings] = web.AppKey("media_settings", MediaSettings)
_METRICS_KEY: web.AppKey[IngestMetrics] = web.AppKey("ingest_metrics", IngestMetrics)


def _api_error(exc: IntakeError | DescriptorError) -> ApiError:
    code = exc.code if isinstance(exc, IntakeError) else "request.invalid_descriptor"
    return ApiError(code, f"{exc.field}: {exc.message}" if exc.field else exc.message)


def _section_tipo(request: web.Request) -> str:
    section_tipo = request.match_info["section_tipo"]
    try:
        return validate_section_tipo(section_tipo)
    except DescriptorError as exc:
        raise _api_error(exc) from exc


def _wake(request: web.Request) -> None:
    drain = request.app.get(DRAIN_KEY)
    if drain is not None:
        drain.wake()


async def put_section(request: web.Request) -> web.Response:
    require_admin(request)
    section_tipo = _section_tipo(request)
    body = await read_json(request)
    try:
        descriptor = await SectionStore(request.app[POOL_KEY]).put(section_tipo, body)
    except DescriptorError as exc:
        raise _api_error(exc) from exc
    return envelope_ok(request, {"section_tipo": section_tipo, "descriptor": descriptor})


async def get_section(request: web.Request) -> web.Response:
    require_admin(request)
    section_tipo = _section_tipo(request)
    descriptor = await SectionStore(request.app[POOL_KEY]).get(section_tipo)
    if descriptor is None:
        raise ApiError.not_found(f"section {section_tipo!r} has no descriptor")
    return envelope_ok(request, {"section_tipo": section_tipo, "descriptor": descriptor})


async def post_records(request: web.Request) -> web.Response:
    require_admin(request)
    body = await read_json(request)
    try:
        records = as_record_list(body)
        queued = await enqueue_records(
            request.app[POOL_KEY],
            records,
            max_records=request.app[INGEST_SETTINGS_KEY].max_records_per_request,
            media=request.app[MEDIA_SETTINGS_KEY],
        )
    except IntakeError as exc:
        raise _api_error(exc) from exc
    _wake(request)
    response = envelope_ok(request, {"accepted": len(records), "queued": queued}, msg="accepted")
    response.set_status(202)
    return response


async def delete_record(request: web.Request) -> web.Response:
    require_admin(request)
    section_tipo = _section_tipo(request)
    try:
        section_id = parse_id(request.match_info["section_id"], field="section_id")
    except FieldError as exc:
        raise ApiError("request.invalid_record", str(exc)) from exc
    try:
        await enqueue_delete(request.app[POOL_KEY], section_tipo, section_id)
    except IntakeError as exc:
        raise _api_error(exc) from exc
    _wake(request)
    response = envelope_ok(
        request, {"section_tipo": section_tipo, "section_id": section_id, "queued": 1}, msg="accepted"
    )
    response.set_status(202)
    return response


async def queue_stats(request: web.Request) -> web.Response:
    require_admin(request)
    settings = request.app[INGEST_SETTINGS_KEY]
    stats = await queue.stats(request.app[POOL_KEY], settings.max_attempts)
    rows = await drain_registry.list_workers(request.app[POOL_KEY], stale_after_s=stale_after_s(settings))
    drain = request.app.get(DRAIN_KEY)
    if drain is not None:
        drain.metrics.observe_stats(stats)
        drain.metrics.observe_workers(rows)
    return envelope_ok(
        request,
        {
            **stats.as_dict(),
            "workers": [w.as_dict() for w in rows],
            "drain": drain.status() if drain is not None else None,
        },
    )


async def queue_retry(request: web.Request) -> web.Response:
    require_admin(request)
    body = await read_json(request) if request.can_read_body else {}
    if not isinstance(body, dict):
        raise ApiError.invalid_request("the body must be an object")
    section_tipo = body.get("section_tipo")
    section_id = body.get("section_id")
    if section_tipo is not None and not isinstance(section_tipo, str):
        raise ApiError.invalid_request("section_tipo must be a string")
    if section_id is not None and (isinstance(section_id, bool) or not isinstance(section_id, int)):
        raise ApiError.invalid_request("section_id must be an integer")
    changed = await queue.retry(
        request.app[POOL_KEY],
        section_tipo=section_tipo,
        section_id=section_id,
        include_blocked=bool(body.get("include_blocked", False)),
        max_attempts=request.app[INGEST_SETTINGS_KEY].max_attempts,
    )
    _wake(request)
    return envelope_ok(request, {"retried": changed})


async def queue_failed(request: web.Request) -> web.Response:
    """Parked records with their last error and attempts (the console's retry list); at most 200."""
    require_admin(request)
    rows = await queue.list_entries(
        request.app[POOL_KEY],
        max_attempts=request.app[INGEST_SETTINGS_KEY].max_attempts,
        failed_only=True,
        limit=200,
    )
    for row in rows:  # timestamps as ISO 8601 text, as JSON has no time type
        row["next_attempt_at"] = row["next_attempt_at"].isoformat()
        row["created_at"] = row["created_at"].isoformat()
    return envelope_ok(request, {"failed": rows})


async def list_sections(request: web.Request) -> web.Response:
    """Every stored section descriptor, by section tipo."""
    require_admin(request)
    store = SectionStore(request.app[POOL_KEY])
    tipos = await store.list()
    return envelope_ok(request, {"sections": await store.get_many(tipos)})


async def reconcile(request: web.Request) -> web.Response:
    require_admin(request)
    section_tipo = _section_tipo(request)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ApiError("request.invalid_record", 'the body must be {"ids": [...], "records": [...]}')
    ids = body.get("ids", [])
    records = body.get("records", [])
    if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise ApiError("request.invalid_record", "ids: must be an array of integers")
    if not isinstance(records, list):
        raise ApiError("request.invalid_record", "records: must be an array")
    try:
        report = await reconcile_section(request.app[POOL_KEY], section_tipo, ids, records)
    except IntakeError as exc:
        raise _api_error(exc) from exc
    _wake(request)
    return envelope_ok(request, report.as_dict())


async def _drain_ctx(app: web.Application) -> AsyncIterator[None]:
    """Run the drain loop in the background for the app's lifetime (when enabled)."""
    settings = app[INGEST_SETTINGS_KEY]
    drain = DrainLoop(
        app[POOL_KEY],
        app[SIDECAR_KEY],
        settings,
        text_model=app[SETTINGS_KEY].sidecar.text_model,
        image_model=app[SETTINGS_KEY].sidecar.image_model,
        media=app[MEDIA_SETTINGS_KEY],
        metrics=app[_METRICS_KEY],
        role="gateway",  # one worker (RAG_INGEST_DRAIN_WORKERS) among any `mnemo drain` ones
    )
    app[DRAIN_KEY] = drain
    task = asyncio.create_task(drain.supervise(), name="mnemo-drain") if settings.drain_enabled else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def setup_intake(app: web.Application) -> None:
    """Add the intake routes and the background drain (call after the pool and sidecar
    cleanup contexts are registered: the drain starts once they have)."""
    if INGEST_SETTINGS_KEY not in app:
        app[INGEST_SETTINGS_KEY] = app[SETTINGS_KEY].ingest
    if MEDIA_SETTINGS_KEY not in app:
        app[MEDIA_SETTINGS_KEY] = app[SETTINGS_KEY].media
    metrics = app.get(METRICS_KEY)
    app[_METRICS_KEY] = IngestMetrics(getattr(metrics, "registry", None))
    app.router.add_get("/v1/sections", list_sections)
    app.router.add_put("/v1/sections/{section_tipo}", put_section)
    app.router.add_get("/v1/sections/{section_tipo}", get_section)
    app.router.add_post("/v1/sections/{section_tipo}/reconcile", reconcile)
    app.router.add_post("/v1/records", post_records)
    app.router.add_delete("/v1/records/{section_tipo}/{section_id}", delete_record)
    app.router.add_get("/v1/queue/stats", queue_stats)
    app.router.add_post("/v1/queue/retry", queue_retry)
    app.router.add_get("/v1/queue/failed", queue_failed)
    app.cleanup_ctx.append(_drain_ctx)
