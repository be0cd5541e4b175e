"""``GET /v1/thumbnails/{section_tipo}/{section_id}/{component_tipo}/{index}``: Mnemo's thumbnails.

Served behind the same authentication and ACL as the record's image rows
(section read, image component read, a shared project). A thumbnail the
caller may not see answers exactly like one that does not exist (404
``not_found``, same message), so the route is never an existence oracle.
"""

from __future__ import annotations

from aiohttp import web

from index.image_store import IMAGE_LANG, get_thumbnail
from index.search import ChunkHit

from .acl import chunk_readable
from .auth import authenticate
from .errors import ApiError
from .options import is_tipo
from .resources import POOL_KEY

__all__ = ["setup_thumbnails", "thumbnail"]

_MISSING = "No such thumbnail"


async def thumbnail(request: web.Request) -> web.StreamResponse:
    principal = authenticate(request)
    info = request.match_info
    tipo, component = info["section_tipo"], info["component_tipo"]
    raw_id, raw_index = info["section_id"], info["index"]
    if not (is_tipo(tipo) and is_tipo(component) and raw_id.isdigit() and raw_index.isdigit()):
        raise ApiError.not_found(_MISSING)
    section_id, index = int(raw_id), int(raw_index)
    if section_id >= 2**63 or index >= 2**31:
        raise ApiError.not_found(_MISSING)
    pool = request.app[POOL_KEY]
    # The ACL reads the image row itself (any image model's partition holds the same projects).
    row = await pool.fetchrow(
        """SELECT projects, chunk_meta FROM rag_embeddings
           WHERE modality = 'image' AND section_tipo = $1 AND section_id = $2
             AND component_tipo = $3 AND lang = $4 AND chunk_index = $5
           LIMIT 1""",
        tipo,
        section_id,
        component,
        IMAGE_LANG,
        index,
    )
    if row is None:
        raise ApiError.not_found(_MISSING)
    probe = ChunkHit(
        tipo, section_id, component, IMAGE_LANG, index, "", {}, tuple(row["projects"]), None, 0.0
    )
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
