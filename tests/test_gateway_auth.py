"""Identity: JWT verification (HS256, RS256), claim shapes, the ACL levels, `mnemo token`."""

from __future__ import annotations

import base64
import hashlib
import hmac
import subprocess
import sys
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.access.auth import Principal, TokenVerifier, issue_token
from gateway.base.errors import ApiError
from gateway.base.settings import load_gateway_settings
from schema.settings import SettingsError

SECRET = "s" * 40
REPO_ROOT = Path(__file__).resolve().parent.parent


def _verifier(**env: str) -> TokenVerifier:
    return TokenVerifier(load_gateway_settings({"RAG_JWT_SECRET": SECRET, **env}))


def _expect_invalid(verifier: TokenVerifier, token: str, fragment: str = "") -> ApiError:
    with pytest.raises(ApiError) as info:
        verifier.verify(token)
    assert info.value.code == "auth.invalid_token" and info.value.status == 401
    assert fragment in info.value.message
    return info.value


def test_hs256_round_trip_carries_every_claim() -> None:
    token = issue_token(secret=SECRET, sub="alice", projects=[2, 1], perms={"oh1": 1, "oh1/oh23": 0})
    p = _verifier().verify(token)
    assert p == Principal("alice", frozenset({1, 2}), {"oh1": 1, "oh1/oh23": 0}, False)
    assert (
        _verifier().verify(issue_token(secret=SECRET, sub="root", projects=None, admin=True)).projects is None
    )


def test_alg_none_expired_and_bad_signature_are_refused() -> None:
    v = _verifier()
    claims = {"sub": "eve", "exp": int(time.time()) + 600, "admin": True}
    _expect_invalid(v, jwt.encode(claims, None, algorithm="none"), "'none'")
    _expect_invalid(v, issue_token(secret=SECRET, sub="bob", ttl=-120), "expired")
    _expect_invalid(v, issue_token(secret="x" * 40, sub="bob"))
    _expect_invalid(v, "not.a.token", "malformed")
    _expect_invalid(v, jwt.encode({"sub": "bob"}, SECRET, algorithm="HS256"))  # no exp


def test_rs256_with_a_public_key_and_no_algorithm_confusion(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    (tmp_path / "pub.pem").write_text(public_pem)
    v = TokenVerifier(load_gateway_settings({"RAG_JWT_PUBLIC_KEY": str(tmp_path / "pub.pem")}))
    assert v.verify(issue_token(private_key_pem=private_pem, sub="carol")).sub == "carol"
    # HS256 is not configured here: a token "signed" with the public key as an HMAC secret is refused.
    head = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=")
    body = base64.urlsafe_b64encode(b'{"sub":"eve","exp":9999999999,"admin":true}').rstrip(b"=")
    mac = hmac.new(public_pem.encode(), head + b"." + body, hashlib.sha256).digest()
    forged = (head + b"." + body + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=")).decode()
    _expect_invalid(v, forged, "'HS256'")


@pytest.mark.parametrize(
    "claims",
    [
        {"projects": "all"},
        {"projects": [1, "2"]},
        {"perms": {"oh1": "1"}},
        {"admin": "yes"},
        {"sub": ""},
        # Out of range for the ACL's int4 SQL (a 500 on every search before) or for a level.
        {"projects": [2**40]},
        {"projects": [-1]},
        {"perms": {"oh1": 2**40}},
        {"perms": {"oh1": -1}},
        {"perms": {"oh1": 4}},
        {"sub": "x" * 300},
        {"projects": list(range(10_001))},
        # Keys and subjects that would reach SQL or the logs: the archive's tipo grammar, printable.
        {"perms": {"oh1\u0000": 1}},
        {"perms": {"oh1/\ud800": 1}},
        {"sub": "root\u0000"},
    ],
)
def test_malformed_claims_are_invalid_tokens(claims: dict) -> None:
    body = {"sub": "x", "exp": int(time.time()) + 60, **claims}
    _expect_invalid(_verifier(), jwt.encode(body, SECRET, algorithm="HS256"))


def test_audience_and_issuer_are_enforced_when_configured() -> None:
    v = _verifier(RAG_JWT_AUDIENCE="mnemo", RAG_JWT_ISSUER="archive")
    good = issue_token(secret=SECRET, sub="a", audience="mnemo", issuer="archive")
    assert v.verify(good).sub == "a"
    _expect_invalid(v, issue_token(secret=SECRET, sub="a", audience="other", issuer="archive"))
    _expect_invalid(v, issue_token(secret=SECRET, sub="a"))


def test_levels_components_and_projects() -> None:
    p = Principal("r", frozenset({1}), {"oh1": 1, "oh1/oh23": 0, "rsc1/rsc9": 2})
    assert p.section_level("oh1") == 1 and p.section_level("oh2") == 0
    assert p.component_level("oh1", "oh22") == 1  # inherits the section's level
    assert p.component_level("oh1", "oh23") == 0  # explicitly lowered
    assert p.component_level("rsc1", "rsc9") == 2 and p.component_level("rsc1", "rsc8") == 0
    assert p.can_read_record("oh1", [3, 1]) and not p.can_read_record("oh1", [3])
    assert not p.can_read_record("oh1", []) and not p.can_read_record("oh2", [1])
    everything = Principal("a", None, {"oh1": 1})
    assert everything.can_read_record("oh1", []) and not everything.can_read_record("oh2", [1])
    admin = Principal("root", frozenset(), {}, admin=True)
    assert admin.can_read_record("any", []) and admin.component_level("x", "y") >= 1


def test_short_secret_and_missing_keys_are_refused_at_start() -> None:
    with pytest.raises(SettingsError, match="at least 32"):
        load_gateway_settings({"RAG_JWT_SECRET": "short"})
    with pytest.raises(SettingsError, match="RAG_JWT_SECRET"):
        load_gateway_settings({})
    assert load_gateway_settings({"RAG_AUTH": "off"}).auth == "off"


def test_mnemo_token_prints_the_token_alone() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "token",
            "--sub",
            "alice",
            "--projects",
            "1,2",
            "--perm",
            "oh1=1",
            "--perm",
            "oh1/oh23=0",
            "--ttl",
            "600",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
        env={"RAG_JWT_SECRET": SECRET, "PATH": ""},
    ).stdout
    assert out.count("\n") == 1
    p = _verifier().verify(out.strip())
    assert (p.sub, p.projects, dict(p.perms), p.admin) == (
        "alice",
        frozenset({1, 2}),
        {"oh1": 1, "oh1/oh23": 0},
        False,
    )
    admin = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "token", "--sub", "root", "--admin", "--projects", "*"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
        env={"RAG_JWT_SECRET": SECRET, "PATH": ""},
    ).stdout.strip()
    assert _verifier().verify(admin).admin
    refused = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "token", "--sub", "x"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={"RAG_JWT_SECRET": "short", "PATH": ""},
    )
    assert refused.returncode == 2 and refused.stdout == ""


def test_every_gateway_setting_is_documented() -> None:
    from gateway.base.settings import env_settings_rows
    from tests.test_docs import documentation_text

    docs = documentation_text()
    for env, _default, help_text in env_settings_rows():
        assert help_text and f"`{env}`" in docs, f"{env} missing from the docs (docs/configuration.md)"


def test_a_verified_token_is_kept_until_its_exp_and_failures_never(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verifier keeps tokens it verified (a caller's next request skips the signature check) but
    re-checks the clock on every hit: the token expires exactly when PyJWT would refuse it."""
    v = _verifier(RAG_JWT_LEEWAY="0")
    exp = int(time.time()) + 2
    token = jwt.encode({"sub": "alice", "exp": exp, "perms": {"oh1": 1}}, SECRET, algorithm="HS256")
    first = v.verify(token)
    decodes = []
    real = jwt.decode
    monkeypatch.setattr(jwt, "decode", lambda *a, **k: decodes.append(1) or real(*a, **k))
    assert v.verify(token) is first and decodes == []  # kept: no second verification
    time.sleep(max(0.0, exp - time.time()) + 0.05)
    _expect_invalid(v, token, "expired")
    assert decodes == [1]  # the expired hit was verified again, which refused it
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for _ in range(2):
        _expect_invalid(v, forged)
    assert token not in v._verified and forged not in v._verified
