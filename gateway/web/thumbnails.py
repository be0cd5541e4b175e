"""``GET /v1/thumbnails/{section_tipo}/{section_id}/{component_tipo}/{index}``: Mnemo's thumbnails.

Served behind the same authentication and ACL as the record's image rows
(section read, image component read, a shared project). A thumbnail the
caller may not see answers exactly like one that does not exist (404
``not_found``, same message), so the route is never an existence oracle.
"""

from __future__ import annotations

from aiohttp import web

from gateway.access.acl import chunk_readable
from gateway.access.auth import authenticate
from gateway.actions.options import is_tipo
from gateway.base.errors import ApiError
from gateway.base.resources import POOL_KEY
from index.store.hits import ChunkHit
from index.store.image_rows import IMAGE_LANG
from index.store.image_store import get_thumbnail, image_projects
from index.store.validation import FieldError, parse_id

__all__ = ["setup_thumbnails", "thumbnail"]

_MISSING = "No such thumbnail"
INDEX_MAX = 2**31 - 1  # chunk_index is int4


async def thumbnail(request: web.Request) -> web.StreamResponse:
    principal = authenticate(request)
    info = request.match_info
    tipo, component = info["section_tipo"], info["component_tipo"]
    if not (is_tipo(tipo) and is_tipo(component)):
        raise ApiError.not_found(_MISSING)
    try:  # ASCII digits only: str.isdigit() took "٥" for record 5, and int() of "²" raised
        section_id = parse_id(info["section_id"], field="section_id")
        index = parse_id(info["index"], field="index", maximum=INDEX_MAX)
    except FieldError:
        raise ApiError.not_found(_MISSING) from None
    pool = request.app[POOL_KEY]
    # The ACL reads the image row itself.
    projects = await image_projects(pool, tipo, section_id, component, index)
    if projects is None:
        raise ApiError.not_found(_MISSING)
    probe = ChunkHit(tipo, section_id, component, IMAGE_LANG, index, "", {}, projects, None, 0.0)
    if not chunk_readable(principal, probe):
        raise ApiError.not_found(_MISSING)
    found = await get_thumbnail(pool, tipo, section_id, component, index)
    if found is None:
        raise ApiError.not_found(_MISSING)
    data, mime = found
    response = web.Response(body=data, content_type=mime)
    # Per-user permissions: shared caches must not keep it.
    response.headers["Cache-Control"] = "private, max-age=300"
    return response


def setup_thumbnails(app: web.Application) -> None:
    app.router.add_get("/v1/thumbnails/{section_tipo}/{section_id}/{component_tipo}/{index}", thumbnail)
