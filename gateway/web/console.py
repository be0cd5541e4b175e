"""The console for people (``/console``) and the API docs (``/docs``), served by the gateway.

The console is static files shipped in the package (``gateway/web/console/``): plain modern JavaScript
that calls the same public API as everyone else with the token the person pastes, so it gains no
privilege of its own. ``/docs`` renders ``/openapi.json`` with Swagger UI from the
``swagger-ui-bundle-v2`` package (no CDN). Both pages are served under a strict
Content-Security-Policy: scripts and styles from this origin only, no inline script.

``GET /v1/whoami`` exists for the console but serves any client: who the bearer token says the
caller is (and whether ``RAG_AUTH=off`` made them an admin), so a person sees what they signed in
as. The operations page lists the served models from ``GET /v1/models``
(:mod:`gateway.web.embeddings`), where an admin also reads each one's device and dtype.

``RAG_CONSOLE_ENABLED=false`` removes the pages (404); the API is unchanged.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from aiohttp import web
from swagger_ui_bundle import swagger_ui_path

from gateway.access.auth import authenticate
from gateway.base.errors import ApiError, envelope_ok
from gateway.base.resources import SETTINGS_KEY

__all__ = ["CONTENT_SECURITY_POLICY", "setup_console"]

# No inline script or style, nothing from another origin. Thumbnails arrive as blobs (fetched with
# the token, so an <img src> never carries it); Swagger UI draws its icons from data: URIs.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The pages change with the package; a stale cached script against a newer API helps nobody.
    "Cache-Control": "no-cache",
}
_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
# The Swagger UI files /docs needs (the package ships more: source maps, ES bundles).
_SWAGGER_FILES = frozenset({"swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "swagger-ui.css"})


def _console_dir() -> Path:
    return Path(str(resources.files(__package__) / "console"))


def _file_response(folder: Path, name: str) -> web.FileResponse:
    """A file of ``folder`` by bare name (no sub-paths: nothing outside the folder is reachable)."""
    path = folder / name
    kind = _TYPES.get(path.suffix)
    if "/" in name or name.startswith(".") or kind is None or not path.is_file():
        raise ApiError.not_found("No such console file")
    return web.FileResponse(path, headers={**_SECURITY_HEADERS, "Content-Type": kind + "; charset=utf-8"})


async def console_page(request: web.Request) -> web.StreamResponse:
    """The console: search, ask, objects and operations in the browser."""
    return _file_response(_console_dir(), "index.html")


async def console_file(request: web.Request) -> web.StreamResponse:
    """A script, style sheet or image of the console."""
    return _file_response(_console_dir(), request.match_info["name"])


async def docs_page(request: web.Request) -> web.StreamResponse:
    """The OpenAPI description rendered by Swagger UI, with "try it" against this gateway."""
    return _file_response(_console_dir(), "docs.html")


async def docs_file(request: web.Request) -> web.StreamResponse:
    """A file of the packaged Swagger UI."""
    name = request.match_info["name"]
    if name not in _SWAGGER_FILES:
        raise ApiError.not_found("No such console file")
    return _file_response(Path(str(swagger_ui_path)), name)


async def whoami(request: web.Request) -> web.Response:
    """The caller as the gateway sees them: subject, admin, projects, and the auth mode."""
    principal = authenticate(request)
    return envelope_ok(
        request,
        {
            "sub": principal.sub,
            "admin": principal.admin,
            "projects": None if principal.projects is None else sorted(principal.projects),
            "auth": request.app[SETTINGS_KEY].auth,
        },
    )


def setup_console(app: web.Application) -> None:
    """The whoami route always; the pages unless ``RAG_CONSOLE_ENABLED`` is off."""
    app.router.add_get("/v1/whoami", whoami)
    if not app[SETTINGS_KEY].console_enabled:
        return
    app.router.add_get("/console", console_page)
    app.router.add_get("/console/{name}", console_file)
    app.router.add_get("/docs", docs_page)
    app.router.add_get("/docs/{name}", docs_file)
