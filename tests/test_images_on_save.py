"""Images on save: the descriptor's context, record images at intake, and the drain's image rows
(real PostgreSQL, the real Ray Serve sidecar with the tiny random SigLIP, the coins photographs)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from PIL import Image

from index.ingest.drain import drain_once
from index.ingest.images import ImageRejected, MediaNotAllowed, prepare_image, resolve_media_path
from index.ingest.intake import IntakeError, enqueue_records
from index.settings import MediaSettings
from index.store.image_store import get_thumbnail
from index.store.partitions import get_partition
from index.store.sections import DescriptorError, SectionStore, validate_descriptor
from tests.fixtures.sidecar import bomb_png
from tests.image_support import COIN_SECTION, COINS, IMAGE_MODEL
from tests.ingest_support import SETTINGS, CountingClient, queue_rows

MEDIA = MediaSettings(media_root=str(COINS), image_max_px=64, thumbnail_px=24)


def coin(section_id: int, *images: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {
        "section_tipo": "coins1",
        "section_id": section_id,
        "projects": [1],
        "title": f"Coin {section_id}",
        "groups": {},
        "images": list(images),
        "metadata": metadata,
    }


def b64(path: str) -> str:
    return base64.b64encode((COINS / path).read_bytes()).decode()


# -- the descriptor's context ------------------------------------------------------------------------


def test_context_is_normalized_with_role_kinds() -> None:
    d = validate_descriptor(COIN_SECTION)
    assert d["context"]["images"] == [
        {"tipo": "numd5", "view": "obverse"},
        {"tipo": "numd6", "view": "reverse"},
    ]
    assert d["context"]["metadata"] == {
        "denomination": {"tipo": "numd10", "kind": "categorical"},
        "material": {"tipo": "numd30", "kind": "categorical"},
        "period": {"tipo": "numd20", "kind": "date"},  # the archive's date role by name
    }
    assert validate_descriptor(d) == d  # what GET returns can be PUT back


@pytest.mark.parametrize(
    ("context", "field"),
    [
        ({"images": [{"view": "obverse"}]}, "context.images[0].tipo"),
        ({"images": [{"tipo": "numd5", "view": "two words"}]}, "context.images[0].view"),
        ({"images": [{"tipo": "numd5"}, {"tipo": "numd5"}]}, "context.images[1].tipo"),
        ({"metadata": {"typology": "1bad"}}, "context.metadata.typology"),
        ({"metadata": {"period": {"tipo": "numd20", "kind": "century"}}}, "context.metadata.period.kind"),
        ({"metadata": {"a": "numd10", "b": "numd10"}}, "context.metadata.b"),
        ({"compare_scope": "coins1"}, "context.compare_scope"),
        ({"compare_scope": ["coins 1"]}, "context.compare_scope[0]"),
    ],
)
def test_bad_context_names_the_field(context: dict[str, Any], field: str) -> None:
    with pytest.raises(DescriptorError) as err:
        validate_descriptor({"embed": [{"id": "card", "contributors": ["x1"]}], "context": context})
    assert err.value.field == field


# -- sources and preparation -------------------------------------------------------------------------


def test_media_paths_cannot_escape_the_root(tmp_path: Path) -> None:
    (tmp_path / "media").mkdir()
    (tmp_path / "secret.jpg").write_bytes(b"x")
    (tmp_path / "media" / "link.jpg").symlink_to(tmp_path / "secret.jpg")
    assert resolve_media_path(tmp_path / "media", "a/b.jpg") == tmp_path / "media" / "a" / "b.jpg"
    for bad in ("../secret.jpg", "/etc/passwd", "a/../../secret.jpg", "link.jpg"):
        with pytest.raises(MediaNotAllowed):
            resolve_media_path(tmp_path / "media", bad)
    with pytest.raises(MediaNotAllowed, match="RAG_MEDIA_ROOT is not set"):
        resolve_media_path(None, "a.jpg")


def test_prepare_orients_downsizes_and_refuses_bombs() -> None:
    # A 60x20 image stored sideways with EXIF orientation 6 (rotate 90°): upright it is 20x60.
    image = Image.new("RGB", (60, 20), (200, 10, 10))
    exif = image.getexif()
    exif[0x0112] = 6
    out = io.BytesIO()
    image.save(out, format="JPEG", exif=exif)
    prepared = prepare_image(out.getvalue(), max_px=30, max_pixels=10_000, thumbnail_px=12)
    assert (prepared.width, prepared.height) == (10, 30)
    assert Image.open(io.BytesIO(prepared.thumbnail)).size == (4, 12)
    assert Image.open(io.BytesIO(prepared.jpeg)).mode == "RGB"
    with pytest.raises(ImageRejected) as err:
        prepare_image(bomb_png(50_000, 50_000), max_px=30, max_pixels=10_000)
    assert err.value.reason == "too_many_pixels"
    with pytest.raises(ImageRejected) as err:
        prepare_image(b"not an image at all", max_px=30, max_pixels=10_000)
    assert err.value.reason == "not_an_image"


# -- intake ------------------------------------------------------------------------------------------


@pytest.fixture
async def pool(db_pool: asyncpg.Pool) -> asyncpg.Pool:
    await SectionStore(db_pool).put("coins1", COIN_SECTION)
    return db_pool


@pytest.mark.parametrize(
    ("image", "metadata", "code", "field"),
    [
        ({"tipo": "numd5", "path": "../SOURCE.txt"}, {}, "request.media_not_allowed", "[0].images[0].path"),
        ({"tipo": "numd5", "path": "1c/missing.jpg"}, {}, "request.invalid_image", "[0].images[0].path"),
        (
            {"tipo": "numd5", "url": "https://x.org/a.jpg"},
            {},
            "request.media_not_allowed",
            "[0].images[0].url",
        ),
        ({"tipo": "numd5", "data": "%%%"}, {}, "request.invalid_image", "[0].images[0].data"),
        ({"tipo": "numd5"}, {}, "request.media_not_allowed", "[0].images[0]"),
        (
            {"tipo": "numd9", "path": "1c/train_10_24.jpg"},
            {},
            "request.unknown_image_component",
            "[0].images[0].tipo",
        ),
        (
            {"tipo": "numd5", "path": "1c/train_10_24.jpg", "view": "a b"},
            {},
            "request.invalid_record",
            "[0].images[0].view",
        ),
        (
            {"tipo": "numd5", "path": "1c/train_10_24.jpg"},
            {"numd99": "x"},
            "request.unknown_metadata_component",
            "[0].metadata.numd99",
        ),
        (
            {"tipo": "numd5", "path": "1c/train_10_24.jpg"},
            {"numd10": {"from": "x"}},
            "request.invalid_record",
            "[0].metadata.numd10.from",
        ),
    ],
)
async def test_intake_refuses_bad_images_naming_the_field(
    pool: asyncpg.Pool, image: dict[str, Any], metadata: dict[str, Any], code: str, field: str
) -> None:
    with pytest.raises(IntakeError) as err:
        await enqueue_records(pool, [coin(1, image, **metadata)], media=MEDIA)
    assert (err.value.code, err.value.field) == (code, field), err.value
    assert await queue_rows(pool) == []


# -- the drain ---------------------------------------------------------------------------------------


async def image_rows(pool: asyncpg.Pool) -> list[Any]:
    partition = await get_partition(pool, IMAGE_MODEL)
    assert partition is not None
    return await pool.fetch(
        f"""SELECT section_id, component_tipo, view, chunk_index, source_hash, source_text, projects,
                   chunk_meta, embedding, updated_at
            FROM {partition.table} WHERE modality = 'image'
            ORDER BY section_id, component_tipo, chunk_index"""
    )


async def drain(pool: asyncpg.Pool, client: CountingClient) -> Any:
    report = await drain_once(pool, client, SETTINGS, image_model=IMAGE_MODEL, media=MEDIA)
    assert report.error is None, report
    return report


async def test_images_are_indexed_incrementally_and_removed(pool: asyncpg.Pool, sidecar_url: str) -> None:
    obverse = {"tipo": "numd5", "path": "1e/" + sorted(p.name for p in (COINS / "1e").iterdir())[0]}
    reverse = {"tipo": "numd6", "data": b64("2e/" + sorted(p.name for p in (COINS / "2e").iterdir())[0])}
    archive_thumb = {**reverse, "thumb_url": "https://archive.example.org/thumbs/2.jpg"}
    async with CountingClient(sidecar_url) as client:
        await enqueue_records(
            pool,
            [
                coin(
                    1, obverse, reverse, numd10="1e", numd30="bimetallic", numd20={"from": 2002, "to": 2010}
                ),
                coin(2, obverse, archive_thumb, numd10="2e"),
            ],
            media=MEDIA,
        )
        report = await drain(pool, client)
        assert (report.indexed, report.failed, report.images_embedded) == (2, 0, 2)  # deduplicated by hash
        rows = await image_rows(pool)
        assert [(r["section_id"], r["component_tipo"], r["view"]) for r in rows] == [
            (1, "numd5", "obverse"),
            (1, "numd6", "reverse"),
            (2, "numd5", "obverse"),
            (2, "numd6", "reverse"),
        ]
        first = rows[0]
        meta = json.loads(first["chunk_meta"])
        assert first["source_text"] == "Coin 1 · denomination: 1e · material: bimetallic · period: 2002–2010"
        assert meta["roles"]["period"] == {
            "tipo": "numd20",
            "kind": "date",
            "value": {"from": 2002, "to": 2010},
        }
        assert meta["thumb_url"] == "/v1/thumbnails/coins1/1/numd5/0" and meta["own_thumbnail"] is True
        assert json.loads(rows[3]["chunk_meta"])["thumb_url"] == "https://archive.example.org/thumbs/2.jpg"
        assert rows[0]["source_hash"] == rows[2]["source_hash"]
        assert list(rows[0]["embedding"].to_numpy()) == list(rows[2]["embedding"].to_numpy())
        thumb = await get_thumbnail(pool, "coins1", 1, "numd5", 0)
        assert thumb is not None and max(Image.open(io.BytesIO(thumb[0])).size) == 24
        assert await get_thumbnail(pool, "coins1", 2, "numd6", 0) is None  # the archive's thumb_url stands

        # The same payload again: nothing embedded, nothing rewritten.
        await enqueue_records(pool, [coin(2, obverse, archive_thumb, numd10="2e")], media=MEDIA)
        report = await drain(pool, client)
        assert (report.indexed, report.images_embedded) == (1, 0)
        assert [r["updated_at"] for r in await image_rows(pool)] == [r["updated_at"] for r in rows]

        # A metadata change rewrites the summary without embedding; a removed image goes with its thumbnail.
        await enqueue_records(pool, [coin(1, obverse, numd10="1 euro")], media=MEDIA)
        report = await drain(pool, client)
        assert report.images_embedded == 0
        rows = await image_rows(pool)
        assert [(r["section_id"], r["component_tipo"]) for r in rows] == [
            (1, "numd5"),
            (2, "numd5"),
            (2, "numd6"),
        ]
        assert rows[0]["source_text"] == "Coin 1 · denomination: 1 euro"
        assert await get_thumbnail(pool, "coins1", 1, "numd6", 0) is None
        assert await get_thumbnail(pool, "coins1", 1, "numd5", 0) is not None

        # A payload without `images` leaves them; a delete removes rows and thumbnails.
        record = coin(1)
        del record["images"]
        await enqueue_records(pool, [record], media=MEDIA)
        await drain(pool, client)
        assert len(await image_rows(pool)) == 3
        from index.ingest.intake import enqueue_delete

        await enqueue_delete(pool, "coins1", 1)
        await drain(pool, client)
        assert [r["section_id"] for r in await image_rows(pool)] == [2, 2]
        assert await get_thumbnail(pool, "coins1", 1, "numd5", 0) is None


async def test_an_undecodable_image_keeps_its_record_queued_with_the_error(
    pool: asyncpg.Pool, sidecar_url: str
) -> None:
    bad = {"tipo": "numd5", "data": base64.b64encode(b"GIF89a but not really").decode()}
    good = {"tipo": "numd5", "path": "1c/train_10_24.jpg"}
    async with CountingClient(sidecar_url) as client:
        await enqueue_records(pool, [coin(1, bad), coin(2, good)], media=MEDIA)
        report = await drain(pool, client)
    assert (report.indexed, report.failed) == (1, 1)
    queued = await queue_rows(pool)
    assert [(q["section_id"], q["attempts"]) for q in queued] == [(1, 1)]
    assert "images[0]" in queued[0]["last_error"] and "decod" in queued[0]["last_error"]
    assert [r["section_id"] for r in await image_rows(pool)] == [2]


def test_role_values_by_component_tipo_or_role_name() -> None:
    from index.store.image_rows import roles_for, summary_text

    context = validate_descriptor(COIN_SECTION)["context"]
    by_tipo = roles_for(context, {"numd10": "2e", "numd20": {"from": 1999, "to": 2002}, "numd30": ""})
    by_name = roles_for(context, {"denomination": "2e", "period": {"from": 1999, "to": 2002}})
    assert (
        by_tipo
        == by_name
        == {
            "denomination": {"tipo": "numd10", "kind": "categorical", "value": "2e"},
            "period": {"tipo": "numd20", "kind": "date", "value": {"from": 1999, "to": 2002}},
        }
    )
    assert summary_text("Coin", by_tipo) == "Coin · denomination: 2e · period: 1999–2002"
