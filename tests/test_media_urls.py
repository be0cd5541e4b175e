"""Record image URLs never reach outside ``RAG_MEDIA_BASE_URL`` (issue 21).

Two real media servers listen on 127.0.0.1 and record every raw request line's path: the allowed
one, with a secret beside its ``/media/`` folder, and a second one on another port. Each hostile
form is refused at intake with ``request.media_not_allowed`` naming the field; queued past intake
(straight into the queue, as if RAG_MEDIA_BASE_URL had changed since) the drain refuses it too.
Whatever happens, no path outside ``/media/`` and nothing on the other port is ever requested,
while the allowed forms are fetched at exactly their canonical paths.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest
from aiohttp import web

from index.bulk.image_jobs import JobOptions, read_manifest
from index.ingest import queue
from index.ingest.drain import drain_once
from index.ingest.intake import IntakeError, enqueue_records
from index.media_urls import MediaNotAllowed, check_url, parse_allowed_base
from index.settings import MediaSettings
from index.store.sections import SectionStore, validate_descriptor
from schema.settings import SettingsError
from tests.image_support import COIN_SECTION, COINS, IMAGE_MODEL
from tests.ingest_support import SETTINGS, CountingClient, queue_rows

JPEG = (COINS / "1c" / "train_10_24.jpg").read_bytes()

# (name, URL template): {base} is the allowed prefix, {host} 127.0.0.1:PORT, {other} 127.0.0.1:OTHER.
HOSTILE: list[tuple[str, str]] = [
    ("dot segment", "{base}../secret.jpg"),
    ("dot segment deeper", "{base}a/../../secret.jpg"),
    ("single dot segment", "{base}./a.jpg"),
    ("encoded dots", "{base}%2e%2e/secret.jpg"),
    ("encoded dots, mixed case", "{base}%2E%2e/secret.jpg"),
    ("half-encoded dots", "{base}.%2e/secret.jpg"),
    ("double encoding", "{base}%252e%252e/secret.jpg"),
    ("double-encoded slash", "{base}..%252Fsecret.jpg"),
    ("encoded slash", "{base}..%2Fsecret.jpg"),
    ("encoded slash, lower case", "{base}..%2fsecret.jpg"),
    ("encoded backslash", "{base}..%5Csecret.jpg"),
    ("raw backslash", "{base}..\\secret.jpg"),
    ("userinfo", "http://user:pw@{host}/media/a.jpg"),
    ("userinfo naming the allowed host", "http://{host}@{other}/media/a.jpg"),
    ("another port", "http://{other}/media/a.jpg"),
    ("127.1 for 127.0.0.1", "http://127.1:{port}/media/a.jpg"),
    ("decimal IP", "http://2130706433:{port}/media/a.jpg"),
    ("IPv6 loopback", "http://[::1]:{port}/media/a.jpg"),
    ("IPv4-mapped IPv6", "http://[::ffff:127.0.0.1]:{port}/media/a.jpg"),
    ("trailing-dot host", "http://127.0.0.1.:{port}/media/a.jpg"),
    ("fragment", "{base}a.jpg#/../../secret.jpg"),
    ("CRLF", "{base}a.jpg\r\nX-Injected: 1"),
    ("encoded CRLF", "{base}a.jpg%0d%0aX-Injected:%201"),
    ("tab, dropped by urlsplit", "{base}a.jpg\t/../../secret.jpg"),
    ("NUL", "{base}a%00.jpg"),
    ("space", "{base}a b.jpg"),
    ("sibling folder sharing the prefix", "http://{host}/mediaX/a.jpg"),
    ("the prefix without its slash", "http://{host}/media"),
    ("malformed escape", "{base}a%zz.jpg"),
    ("invalid UTF-8", "{base}%ff.jpg"),
    ("file scheme", "file:///etc/passwd"),
    ("ftp scheme", "ftp://{host}/media/a.jpg"),
    ("unterminated IPv6 literal", "http://[::1/media/a.jpg"),
]

# (URL template, the path the media server must see)
ALLOWED: list[tuple[str, str]] = [
    ("{base}a.jpg", "/media/a.jpg"),
    ("{base}dir/b%20c.jpg", "/media/dir/b%20c.jpg"),
    ("HTTP://{host}/media/%61.jpg", "/media/a.jpg"),
    ("{base}a.jpg?size=2", "/media/a.jpg?size=2"),
]


@dataclass
class MediaServer:
    port: int
    requested: list[str] = field(default_factory=list)


async def _recording_server(runners: list[web.AppRunner]) -> MediaServer:
    server = MediaServer(0)

    async def any_path(request: web.Request) -> web.Response:
        server.requested.append(request.raw_path)  # as sent on the request line, not decoded
        return web.Response(body=JPEG, content_type="image/jpeg")

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", any_path)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    runners.append(runner)
    server.port = runner.addresses[0][1]
    return server


@pytest.fixture
async def servers() -> AsyncIterator[tuple[MediaServer, MediaServer]]:
    runners: list[web.AppRunner] = []
    try:
        yield await _recording_server(runners), await _recording_server(runners)
    finally:
        for runner in runners:
            await runner.cleanup()


def _formatter(allowed: MediaServer, other: MediaServer) -> Callable[[str], str]:
    host = f"127.0.0.1:{allowed.port}"
    values = {"base": f"http://{host}/media/", "host": host, "other": f"127.0.0.1:{other.port}"}
    return lambda template: template.format(port=allowed.port, **values)


def _coin(section_id: int, url: str) -> dict[str, object]:
    image = {"tipo": "numd5", "url": url}
    return {
        "section_tipo": "coins1",
        "section_id": section_id,
        "projects": [1],
        "title": "",
        "groups": {},
        "images": [image],
    }


def _media(server: MediaServer) -> MediaSettings:
    return MediaSettings(media_base_url=f"http://127.0.0.1:{server.port}/media/", image_max_px=64)


def test_every_hostile_form_is_refused_by_the_parsed_check() -> None:
    fmt = _formatter(MediaServer(8080), MediaServer(8081))
    allowed = [parse_allowed_base(fmt("{base}"))]
    for name, template in HOSTILE:
        with pytest.raises(MediaNotAllowed):
            check_url(fmt(template), allowed)
            pytest.fail(f"{name}: {fmt(template)!r} was admitted")
    for template, path in ALLOWED:
        assert check_url(fmt(template), allowed) == f"http://127.0.0.1:8080{path}"


@pytest.mark.parametrize(
    "entry",
    ["ftp://h/media/", "http://u@h/media/", "http://h/media/../x/", "http://h/a?b=1", "http://h/%2e%2e/"],
)
def test_an_allow_list_entry_is_held_to_the_same_rules(entry: str) -> None:
    with pytest.raises(SettingsError, match="RAG_MEDIA_BASE_URL entry"):
        MediaSettings(media_base_url=entry).validate()


def test_an_allowed_base_admits_on_segment_boundaries_only() -> None:
    base = parse_allowed_base("https://Media.Example.org/public")  # no trailing slash: made one
    assert base.path == "/public/"
    assert check_url("https://media.example.org:443/public/a.jpg", [base]) == (
        "https://media.example.org/public/a.jpg"
    )
    for bad in (
        "https://media.example.org/publicity/a.jpg",
        "https://media.example.org/private/a.jpg",
        "https://media.example.org.evil.com/public/a.jpg",
        "https://other.org/public/a.jpg",
        "http://media.example.org/public/a.jpg",  # the scheme must match too
    ):
        with pytest.raises(MediaNotAllowed):
            check_url(bad, [base])


@pytest.fixture
async def pool(db_pool: asyncpg.Pool) -> asyncpg.Pool:
    await SectionStore(db_pool).put("coins1", COIN_SECTION)
    return db_pool


async def test_intake_refuses_each_hostile_form_naming_the_field(
    pool: asyncpg.Pool, servers: tuple[MediaServer, MediaServer]
) -> None:
    allowed, other = servers
    fmt = _formatter(allowed, other)
    for name, template in HOSTILE:
        with pytest.raises(IntakeError) as err:
            await enqueue_records(pool, [_coin(1, fmt(template))], media=_media(allowed))
        assert (err.value.code, err.value.field) == ("request.media_not_allowed", "[0].images[0].url"), name
    assert await queue_rows(pool) == []
    assert (allowed.requested, other.requested) == ([], [])


async def test_the_drain_fetches_only_under_the_prefix(
    pool: asyncpg.Pool, servers: tuple[MediaServer, MediaServer], sidecar_url: str
) -> None:
    allowed, other = servers
    fmt = _formatter(allowed, other)
    media = _media(allowed)
    good = [_coin(i, fmt(template)) for i, (template, _) in enumerate(ALLOWED, 1)]
    assert await enqueue_records(pool, good, media=media) == len(ALLOWED)
    # Past intake, straight into the queue: the drain must refuse these on its own.
    hostile = [_coin(100 + i, fmt(template)) for i, (_, template) in enumerate(HOSTILE)]
    await queue.enqueue(pool, [queue.Job("coins1", r["section_id"], "index", r) for r in hostile])

    async with CountingClient(sidecar_url) as client:
        report = await drain_once(pool, client, SETTINGS, image_model=IMAGE_MODEL, media=media)
    assert report.error is None, report
    assert (report.indexed, report.failed) == (len(ALLOWED), len(HOSTILE)), report
    left = {r["section_id"]: r["last_error"] for r in await queue_rows(pool)}
    assert sorted(left) == [r["section_id"] for r in hostile]
    assert all(error for error in left.values()), left  # each kept with its reason

    assert other.requested == []
    assert sorted(allowed.requested) == sorted(path for _, path in ALLOWED)
    for path in allowed.requested:
        assert path.startswith("/media/") and ".." not in path, path
        assert not any(escape in path.lower() for escape in ("%2e", "%2f", "%5c", "%25")), path


# -- the other strings that become a path or a link ---------------------------------------------------


@pytest.mark.parametrize(
    "link",
    ["javascript:alert(1)", "data:image/png;base64,AAAA", "//evil.example/t.jpg", "http://u@h/t.jpg", "a\nb"],
)
async def test_a_thumb_url_must_be_an_http_link_or_a_local_path(pool: asyncpg.Pool, link: str) -> None:
    record = _coin(1, "unused")
    record["images"] = [{"tipo": "numd5", "path": "1c/train_10_24.jpg", "thumb_url": link}]
    with pytest.raises(IntakeError) as err:
        await enqueue_records(pool, [record], media=MediaSettings(media_root=str(COINS)))
    assert (err.value.code, err.value.field) == ("request.media_not_allowed", "[0].images[0].thumb_url")
    for fine in ("https://archive.example.org/thumbs/1.jpg", "/dedalo/media/thumb/1.jpg"):
        record["images"][0]["thumb_url"] = fine
        assert await enqueue_records(pool, [record], media=MediaSettings(media_root=str(COINS))) == 1


def test_a_manifest_line_cannot_name_a_file_outside_the_media_root(tmp_path: Path) -> None:
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "ok.jpg").write_bytes(JPEG)
    (tmp_path / "secret.jpg").write_bytes(JPEG)
    (folder / "link.jpg").symlink_to(tmp_path / "secret.jpg")
    lines = [
        {"path": "ok.jpg"},
        {"path": "../secret.jpg"},
        {"path": str(tmp_path / "secret.jpg")},
        {"path": "link.jpg"},
        {"path": "ok.jpg", "thumb_url": "javascript:alert(1)"},
    ]
    manifest = folder / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    items, rejects = read_manifest(manifest, validate_descriptor(COIN_SECTION), JobOptions("coins1"))
    assert [item.path for item in items] == [str(folder / "ok.jpg")]
    assert [(r.line, r.reason) for r in rejects] == [(n, "media_not_allowed") for n in (2, 3, 4, 5)]
    # With RAG_MEDIA_ROOT set, it is the root: the manifest's own folder no longer is.
    elsewhere = JobOptions("coins1", media=MediaSettings(media_root=str(COINS)))
    _, rejects = read_manifest(manifest, validate_descriptor(COIN_SECTION), elsewhere)
    assert [r.line for r in rejects] == [1, 2, 3, 4, 5]
