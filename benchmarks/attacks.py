"""Targeted attacks for the reliability suite: forged tokens, ACL leaks, and hostile images.

Each function is blocking (plain :func:`benchmarks.fuzz.send` over loopback) and bounded by the
size of its case list; run it off an event loop that serves the target.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import io
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jwt

from .fuzz import Case, error_code, send

__all__ = ["AclProbe", "bad_images", "forged_tokens", "leak_check", "post_json", "token_attacks"]


def post_json(
    url: str, path: str, body: Any, bearer: str | None, timeout: float = 120.0
) -> tuple[int, bytes]:
    headers = (("Content-Type", "application/json"),) + (
        (("Authorization", f"Bearer {bearer}"),) if bearer else ()
    )
    status, _, answer = send(
        url, Case("attack", f"POST {path}", "POST", path, headers, json.dumps(body).encode()), timeout
    )
    return status, answer


# -- forged tokens ---------------------------------------------------------------------------------


def _unsigned(header: dict[str, Any], claims: dict[str, Any], signature: bytes = b"") -> str:
    def part(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return ".".join([part(json.dumps(header).encode()), part(json.dumps(claims).encode()), part(signature)])


def _hmac_signed(claims: dict[str, Any], key: bytes) -> str:
    head_and_claims = _unsigned({"alg": "HS256", "typ": "JWT"}, claims).rsplit(".", 1)[0]
    signature = hmac.new(key, head_and_claims.encode(), hashlib.sha256).digest()
    return head_and_claims + "." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()


def forged_tokens(secret: str, *, now: float | None = None) -> dict[str, str]:
    """Tokens a gateway holding ``secret`` (HS256) must refuse, each named by its attack."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    issued = int(time.time() if now is None else now)
    admin = {
        "sub": "mallory",
        "projects": "*",
        "perms": {},
        "admin": True,
        "iat": issued,
        "exp": issued + 3600,
    }
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    hs_signature = jwt.encode(admin, secret, algorithm="HS256").split(".")[2]
    return {
        "alg none": _unsigned({"alg": "none", "typ": "JWT"}, admin),
        "alg None": _unsigned({"alg": "None"}, admin),
        "alg none with signature": _unsigned({"alg": "none"}, admin, b"sig"),
        "alg missing": _unsigned({"typ": "JWT"}, admin, b"sig"),
        "alg not a string": _unsigned({"alg": ["HS256"]}, admin, b"sig"),
        "wrong HS256 key": jwt.encode(admin, secret + "-not", algorithm="HS256"),
        "RS256 with a key the gateway does not know": jwt.encode(admin, private_pem, algorithm="RS256"),
        "HS/RS confusion: RS256 header, HMAC signature": _unsigned(
            {"alg": "RS256"}, admin, base64.urlsafe_b64decode(hs_signature + "==")
        ),
        # PyJWT refuses to HMAC with a PEM, so the classic confusion token is signed by hand.
        "HS/RS confusion: HS256 keyed with a public PEM": _hmac_signed(admin, public_pem),
        "expired": jwt.encode(
            {**admin, "exp": issued - 3600, "iat": issued - 7200}, secret, algorithm="HS256"
        ),
        "not yet valid (nbf)": jwt.encode({**admin, "nbf": issued + 3600}, secret, algorithm="HS256"),
        "no exp": jwt.encode({k: v for k, v in admin.items() if k != "exp"}, secret, algorithm="HS256"),
        "no sub": jwt.encode({k: v for k, v in admin.items() if k != "sub"}, secret, algorithm="HS256"),
        "sub not a string": jwt.encode({**admin, "sub": 7}, secret, algorithm="HS256"),
        "admin as a string": jwt.encode(
            {**admin, "admin": "true", "projects": []}, secret, algorithm="HS256"
        ),
        "projects as a string": jwt.encode(
            {**admin, "projects": "1,2", "admin": False}, secret, algorithm="HS256"
        ),
        "project id 2**40": jwt.encode(
            {**admin, "projects": [2**40], "admin": False}, secret, algorithm="HS256"
        ),
        "perm level 2**40": jwt.encode(
            {**admin, "perms": {"oh1": 2**40}, "admin": False}, secret, algorithm="HS256"
        ),
        "large claims under the header limit (5 kB)": jwt.encode(
            {**admin, "pad": "x" * 5_000}, secret + "-not", algorithm="HS256"
        ),
        "oversized claims (200 kB)": jwt.encode({**admin, "pad": "x" * 200_000}, secret, algorithm="HS256"),
        "truncated signature": jwt.encode(admin, secret, algorithm="HS256")[:-6],
        "garbage": "a.b.c",
        "empty segments": "..",
        "tampered claims, original signature": ".".join(
            [
                jwt.encode(admin, secret, algorithm="HS256").split(".")[0],
                _unsigned({}, admin).split(".")[1],
                hs_signature,
            ]
        ),
    }


def token_attacks(url: str, tokens: dict[str, str], request: dict[str, Any]) -> dict[str, Any]:
    """Send ``request`` with each token: every one must be refused with a coded 4xx, never served."""
    outcomes: dict[str, Any] = {}
    accepted = []
    for name, token in tokens.items():
        status, body = post_json(url, "/api/v1/json", request, token)
        code = error_code(body)
        outcomes[name] = {"status": status, "code": code}
        # Refused: a coded 4xx. Mostly auth.invalid_token; a token past the header-size limit is the
        # protocol's 400 (request.*) before any verification, which refuses it just as well.
        if not (400 <= status < 500 and code):
            accepted.append(name)
    return {
        "tokens": len(tokens),
        "refused": len(tokens) - len(accepted),
        "not_refused": accepted,
        "by_token": outcomes,
    }


# -- ACL leaks -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AclProbe:
    """A restricted principal, an admin, and what the restricted one may read (the oracle)."""

    admin: str
    restricted: str
    allowed: Callable[[dict[str, Any]], bool]  # one answer row -> may the restricted principal see it
    requests: Sequence[dict[str, Any]]  # dd_rag_api bodies
    # (forbidden-but-existing seed, missing seed) option pairs whose answers must be byte-identical
    twins: Sequence[tuple[dict[str, Any], dict[str, Any]]] = ()


# ask's citations name a record in the archive's camelCase; the oracle reads snake_case.
_CAMEL_KEYS = {"sectionTipo": "section_tipo", "sectionId": "section_id", "componentTipo": "component_tipo"}


def _snake(row: dict[str, Any]) -> dict[str, Any]:
    return {_CAMEL_KEYS.get(k, k): v for k, v in row.items()}


def _rows(data: Any) -> list[dict[str, Any]]:
    """Every row an answer carries, keyed as the oracle reads them."""
    if isinstance(data, list):
        return [_snake(r) for r in data if isinstance(r, dict)]
    if isinstance(data, dict):
        for key in ("hits", "passages", "results", "neighbours", "citations", "records"):
            if isinstance(data.get(key), list):
                return [_snake(r) for r in data[key] if isinstance(r, dict)]
    return []


def _without_request_id(body: bytes) -> bytes:
    payload = json.loads(body)
    payload.pop("request_id", None)
    return json.dumps(payload, sort_keys=True).encode()


def leak_check(url: str, probe: AclProbe) -> dict[str, Any]:
    """Rows a restricted principal received that the oracle forbids; twins that differ."""
    leaked: list[str] = []
    restricted_rows = admin_rows = 0
    statuses: dict[str, int] = {}
    for request in probe.requests:
        status, body = post_json(url, "/api/v1/json", request, probe.restricted)
        admin_status, admin_body = post_json(url, "/api/v1/json", request, probe.admin)
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        if status != 200:
            continue
        rows = _rows(json.loads(body).get("data"))
        restricted_rows += len(rows)
        if admin_status == 200:
            admin_rows += len(_rows(json.loads(admin_body).get("data")))
        for row in rows:
            if not probe.allowed(row):
                leaked.append(f"{request['action']}: {row.get('section_tipo')}/{row.get('section_id')}")
    differing = []
    for forbidden, missing in probe.twins:
        a = post_json(url, "/api/v1/json", forbidden, probe.restricted)
        b = post_json(url, "/api/v1/json", missing, probe.restricted)
        if a[0] != b[0] or _without_request_id(a[1]) != _without_request_id(b[1]):
            differing.append(f"{forbidden['action']}: {a[0]} {a[1][:120]!r} vs {b[0]} {b[1][:120]!r}")
    return {
        "requests": len(probe.requests),
        "statuses": statuses,
        "restricted_rows": restricted_rows,
        "admin_rows": admin_rows,
        "rows_leaked": len(leaked),
        "leaks": leaked[:20],
        "twins": len(probe.twins),
        "twins_differing": differing,
    }


# -- hostile images --------------------------------------------------------------------------------


def _png_bomb(width: int, height: int) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def _gif_bomb(width: int, height: int) -> bytes:
    import struct

    return (
        b"GIF89a"
        + struct.pack("<HH", width, height)
        + b"\x00\x00\x00"
        + b",\x00\x00\x00\x00"
        + struct.pack("<HH", width, height)
        + b"\x00\x02\x02D\x01\x00;"
    )


def bad_images() -> dict[str, bytes]:
    """Images each of which must get a coded 4xx or a correct embedding."""
    from PIL import Image

    def save(image: Image.Image, fmt: str, **kw: Any) -> bytes:
        out = io.BytesIO()
        image.save(out, fmt, **kw)
        return out.getvalue()

    rgb = Image.new("RGB", (48, 32), (200, 40, 10))
    png, jpeg = save(rgb, "PNG"), save(rgb, "JPEG")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90
    frames = [Image.new("P", (16, 16), i) for i in range(3)]
    animated = io.BytesIO()
    frames[0].save(animated, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    return {
        "0 bytes": b"",
        "one byte": b"\x89",
        "truncated PNG": png[: len(png) // 2],
        "truncated JPEG": jpeg[: len(jpeg) // 2],
        "JPEG header only": jpeg[:20],
        "wrong magic (PNG body, JPEG magic)": b"\xff\xd8\xff" + png[3:],
        "text, not an image": b"hello, I am not an image at all",
        "PDF magic": b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj<<>>endobj",
        "PNG bomb 100k x 100k": _png_bomb(100_000, 100_000),
        "PNG bomb 65535 x 65535": _png_bomb(65_535, 65_535),
        "GIF bomb 65535 x 65535": _gif_bomb(65_535, 65_535),
        "CMYK JPEG": save(Image.new("CMYK", (40, 30), (0, 255, 255, 0)), "JPEG"),
        "16-bit grey PNG": save(Image.new("I;16", (40, 30), 40_000), "PNG"),
        "32-bit int TIFF": save(Image.new("I", (40, 30), 70_000), "TIFF"),
        "float TIFF": save(Image.new("F", (20, 20), 0.5), "TIFF"),
        "palette PNG": save(rgb.convert("P"), "PNG"),
        "palette PNG with transparency": save(rgb.convert("P"), "PNG", transparency=0),
        "RGBA PNG": save(Image.new("RGBA", (30, 30), (1, 2, 3, 0)), "PNG"),
        "1-bit PNG": save(Image.new("1", (30, 30), 1), "PNG"),
        "LA PNG": save(Image.new("LA", (30, 30), (9, 100)), "PNG"),
        "EXIF-rotated JPEG": save(rgb, "JPEG", exif=exif),
        "animated GIF": animated.getvalue(),
        "1x1 PNG": save(Image.new("RGB", (1, 1)), "PNG"),
        "1x4000 PNG": save(Image.new("RGB", (1, 4000)), "PNG"),
        "WebP": save(rgb, "WEBP"),
        "BMP": save(rgb, "BMP"),
        "ICO": save(rgb, "ICO"),
    }


def image_attacks(url: str, model: str, images: dict[str, bytes], dimension: int) -> dict[str, Any]:
    """Each image alone on ``/image``: a coded 4xx, or 200 with one finite vector of ``dimension``."""
    outcomes: dict[str, Any] = {}
    bad: list[str] = []
    for name, raw in images.items():
        body = {"model": model, "images": [base64.b64encode(raw).decode()]}
        status, answer = post_json(url, "/image", body, None)
        try:
            payload = json.loads(answer)
        except ValueError:
            payload = None
        code = error_code(answer)
        outcomes[name] = {"status": status, "code": code}
        if status == 200:
            vectors = payload.get("embeddings") if isinstance(payload, dict) else None
            ok = (
                isinstance(vectors, list)
                and len(vectors) == 1
                and len(vectors[0]) == dimension
                and all(isinstance(v, float) and math.isfinite(v) for v in vectors[0])
            )
            if not ok:
                bad.append(f"{name}: 200 without one finite {dimension}-d vector")
        elif not (400 <= status < 500 and isinstance(code, str)):
            bad.append(f"{name}: {status} {answer[:120]!r}")
    return {
        "images": len(images),
        "embedded": sum(o["status"] == 200 for o in outcomes.values()),
        "refused_4xx": sum(400 <= o["status"] < 500 for o in outcomes.values()),
        "server_errors": sum(o["status"] >= 500 or o["status"] == 0 for o in outcomes.values()),
        "problems": bad,
        "by_image": outcomes,
    }
