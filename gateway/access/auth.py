"""Who is calling: bearer JWTs (HS256 or RS256) turned into a :class:`Principal`.

Claims: ``sub``; ``projects`` (a list of project ids, or ``"*"`` for all);
``perms`` (``{"<section_tipo>": level, "<section_tipo>/<component_tipo>": level}``);
``admin`` (reads every section and project); ``grants`` (a list of capabilities
beyond reading: ``"ask"`` lets a non-admin call ``ask`` while
``RAG_ASK_GRANT=required``, see :mod:`gateway.budgets.ledger`). Tokens must carry ``exp``.
Only the algorithms a key is configured for are accepted, so ``alg: none``
and HS256-signed-with-the-public-key tricks fail as invalid tokens.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import jwt
from aiohttp import web

from gateway.base.errors import ApiError
from gateway.base.resources import SETTINGS_KEY
from gateway.base.settings import GatewaySettings
from index.lru import Lru
from index.store.validation import CONTRIBUTOR_PATTERN, PROJECT_ID_MAX

log = logging.getLogger(__name__)

ADMIN_LEVEL = 3  # the archive's levels: 0 none, 1 read, 2 write, 3 admin
# Claims are bounded at the door: each value reaches SQL as int4 (projects) or is a level, and
# a token is not a place for megabytes of grants.
MAX_CLAIM_ITEMS = 10_000
MAX_SUB_CHARS = 256
MAX_GRANTS = 64
VERIFIED_TOKENS = 4096  # verified tokens kept (LRU), so a caller's next request skips the signature check
# A perms key is a section tipo or "section/component": the grammar ingestion stores them in. Keys
# reach SQL as parameters, where a NUL or a lone surrogate would be a database error (a 500).
_PERM_KEY = re.compile(CONTRIBUTOR_PATTERN)
UNPRINTABLE = re.compile("[\x00-\x1f\ud800-\udfff]")


@dataclass(frozen=True)
class Principal:
    """The caller, as far as the ACL is concerned."""

    sub: str
    projects: frozenset[int] | None = frozenset()  # None: every project ("*")
    perms: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    admin: bool = False
    grants: frozenset[str] = frozenset()  # capabilities beyond reading, e.g. "ask"

    def section_level(self, section_tipo: str) -> int:
        """The caller's level on a section (0 when not granted)."""
        if self.admin:
            return ADMIN_LEVEL
        return int(self.perms.get(section_tipo, 0))

    def component_level(self, section_tipo: str, component_tipo: str) -> int:
        """The explicit ``section/component`` level, else the section's level."""
        if self.admin:
            return ADMIN_LEVEL
        explicit = self.perms.get(f"{section_tipo}/{component_tipo}")
        return int(explicit) if explicit is not None else self.section_level(section_tipo)

    def can_read_project(self, projects: Sequence[int]) -> bool:
        """Per-record projects: the record shares a project with the caller.

        A record with no project at all is readable only by callers holding
        every project (``"*"``) or admins: an unassigned record is not public.
        """
        if self.admin or self.projects is None:
            return True
        return any(p in self.projects for p in projects)

    def can_read_record(self, section_tipo: str, projects: Sequence[int]) -> bool:
        """Section read (level >= 1) and per-record project membership."""
        return self.section_level(section_tipo) >= 1 and self.can_read_project(projects)


ANONYMOUS_ADMIN = Principal(sub="anonymous (RAG_AUTH=off)", projects=None, admin=True)


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _claims_to_principal(claims: Mapping[str, Any]) -> Principal:
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub or len(sub) > MAX_SUB_CHARS or UNPRINTABLE.search(sub):
        raise ApiError.invalid_token(f"The token's subject must be 1..{MAX_SUB_CHARS} characters")
    raw_projects = claims.get("projects", [])
    projects: frozenset[int] | None
    if raw_projects == "*":
        projects = None
    elif (
        isinstance(raw_projects, list)
        and len(raw_projects) <= MAX_CLAIM_ITEMS
        and all(_int_in(p, 0, PROJECT_ID_MAX) for p in raw_projects)
    ):
        projects = frozenset(raw_projects)
    else:
        raise ApiError.invalid_token(
            f'The token\'s "projects" claim must be "*" or a list of at most {MAX_CLAIM_ITEMS} ids '
            f"in 0..{PROJECT_ID_MAX}"
        )
    raw_perms = claims.get("perms", {})
    if (
        not isinstance(raw_perms, dict)
        or len(raw_perms) > MAX_CLAIM_ITEMS
        or not all(
            isinstance(k, str) and _PERM_KEY.match(k) and _int_in(v, 0, ADMIN_LEVEL)
            for k, v in raw_perms.items()
        )
    ):
        raise ApiError.invalid_token(
            f'The token\'s "perms" claim must map at most {MAX_CLAIM_ITEMS} tipos to levels 0..{ADMIN_LEVEL}'
        )
    admin = claims.get("admin", False)
    if not isinstance(admin, bool):
        raise ApiError.invalid_token('The token\'s "admin" claim must be a boolean')
    grants = claims.get("grants", [])
    if not (
        isinstance(grants, list)
        and len(grants) <= MAX_GRANTS
        and all(isinstance(g, str) and 0 < len(g) <= 64 and not UNPRINTABLE.search(g) for g in grants)
    ):
        raise ApiError.invalid_token(
            f'The token\'s "grants" claim must be a list of at most {MAX_GRANTS} names'
        )
    return Principal(
        sub=sub,
        projects=projects,
        perms=MappingProxyType(dict(raw_perms)),
        admin=admin,
        grants=frozenset(grants),
    )


class TokenVerifier:
    """Verifies bearer tokens against the configured keys (HS256 secret and/or RS256 public key)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self._keys: dict[str, Any] = {}
        if settings.jwt_secret:
            self._keys["HS256"] = settings.jwt_secret
        pem = settings.public_key_pem
        if pem:
            from cryptography.hazmat.primitives.serialization import load_pem_public_key

            self._keys["RS256"] = load_pem_public_key(pem.encode())
        self._audience = settings.jwt_audience
        self._issuer = settings.jwt_issuer
        self._leeway = settings.jwt_leeway
        # Verified tokens: token -> (principal, valid from, valid until), monotonic-free wall clock.
        # A token's signature, audience, issuer and claims decide the same way every time; only
        # the clock moves, so a hit re-checks the time window and nothing else. Failures are never
        # kept (a forged token costs a full verification each time).
        self._verified: Lru[str, tuple[Principal, float, float]] = Lru(VERIFIED_TOKENS)

    def verify(self, token: str) -> Principal:
        """The token's principal; a token verified before is only re-checked against the clock."""
        hit = self._verified.get(token)
        if hit is not None:
            principal, valid_from, valid_until = hit
            if valid_from <= time.time() < valid_until:
                return principal
            self._verified.pop(token)  # expired (or not yet valid): verify again, which says why
        principal, claims = self._verify(token)
        window = _time_window(claims, self._leeway)
        if window is not None:
            self._verified.put(token, (principal, *window))
        return principal

    def _verify(self, token: str) -> tuple[Principal, Mapping[str, Any]]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise ApiError.invalid_token("The bearer token is malformed") from exc
        alg = header.get("alg")
        key = self._keys.get(alg) if isinstance(alg, str) else None
        if key is None:
            raise ApiError.invalid_token(f"The token algorithm {alg!r} is not accepted")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._leeway,
                options={"require": ["exp", "sub"], "verify_aud": self._audience is not None},
            )
        except jwt.ExpiredSignatureError as exc:
            raise ApiError.invalid_token("The token has expired") from exc
        except jwt.PyJWTError as exc:
            raise ApiError.invalid_token() from exc
        return _claims_to_principal(claims), claims


def _time_window(claims: Mapping[str, Any], leeway: float) -> tuple[float, float] | None:
    """When PyJWT would accept these claims again: [max(nbf, iat) - leeway, exp + leeway); None when
    a time claim is not a plain number (then the token is verified in full every time)."""
    times = {k: claims.get(k) for k in ("exp", "nbf", "iat")}
    if any(v is not None and (isinstance(v, bool) or not isinstance(v, int | float)) for v in times.values()):
        return None
    exp = times["exp"]
    if exp is None:  # verification requires exp, so a verified token has one
        return None
    starts = [float(v) for k, v in times.items() if k != "exp" and v is not None]
    return (max(starts, default=float("-inf")) - leeway, float(exp) + leeway)


# Auth's own state: the app's verifier, and each request's principal (memoized by authenticate()).
VERIFIER_KEY: web.AppKey[TokenVerifier] = web.AppKey("token_verifier", TokenVerifier)
PRINCIPAL_KEY: web.RequestKey[Principal] = web.RequestKey("principal", Principal)


def authenticate(request: web.Request) -> Principal:
    """The caller of this request (memoized on the request).

    Raises ``auth.not_logged`` without a bearer token and ``auth.invalid_token``
    for a bad one. With ``RAG_AUTH=off`` every caller is an admin.
    """
    cached = request.get(PRINCIPAL_KEY)
    if cached is not None:
        return cached
    settings = request.app[SETTINGS_KEY]
    if settings.auth == "off":
        principal = ANONYMOUS_ADMIN
    else:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if not header:
            raise ApiError.not_logged()
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError.invalid_token("Use an Authorization: Bearer <token> header")
        principal = request.app[VERIFIER_KEY].verify(token.strip())
    request[PRINCIPAL_KEY] = principal
    return principal


def require_admin(request: web.Request) -> Principal:
    """The caller, who must be an admin (``auth.forbidden`` otherwise)."""
    principal = authenticate(request)
    if not principal.admin:
        raise ApiError.forbidden("This route needs an admin token")
    return principal


def issue_token(
    *,
    secret: str | None = None,
    private_key_pem: str | None = None,
    sub: str,
    projects: Sequence[int] | None = (),
    perms: Mapping[str, int] | None = None,
    admin: bool = False,
    grants: Sequence[str] = (),
    ttl: float = 3600.0,
    audience: str | None = None,
    issuer: str | None = None,
    now: float | None = None,
) -> str:
    """Sign a development token (HS256 with ``secret``, or RS256 with ``private_key_pem``).

    ``projects=None`` grants every project (``"*"``).
    """
    if (secret is None) == (private_key_pem is None):
        raise ValueError("give exactly one of secret (HS256) or private_key_pem (RS256)")
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {
        "sub": sub,
        "projects": "*" if projects is None else sorted(set(projects)),
        "perms": dict(perms or {}),
        "admin": admin,
        "grants": sorted(set(grants)),
        "iat": issued,
        "exp": issued + int(ttl),
    }
    if audience:
        claims["aud"] = audience
    if issuer:
        claims["iss"] = issuer
    if secret is not None:
        return jwt.encode(claims, secret, algorithm="HS256")
    return jwt.encode(claims, private_key_pem, algorithm="RS256")


def setup_auth(app: web.Application, settings: GatewaySettings) -> None:
    """Install the token verifier; with ``RAG_AUTH=off`` say loudly that nothing is checked."""
    app[VERIFIER_KEY] = TokenVerifier(settings)
    if settings.auth == "off":
        log.warning(
            "RAG_AUTH=off: EVERY CALLER IS TREATED AS AN ADMIN and the ACL admits everything. "
            "Local demos only; never expose this gateway."
        )
