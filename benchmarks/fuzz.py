"""Fuzzing a service from its own ``/openapi.json``: hypothesis-generated requests, valid and hostile.

For every operation the document lists, :func:`fuzz_service` draws cases from :func:`case_strategy`
(one class per kind of hostility, see :data:`CLASSES`), sends each over a fresh loopback connection
with :mod:`http.client` (raw bytes: invalid UTF-8 and odd headers must reach the server as sent),
and checks the answer: never a dropped connection, and always the service's error shape (envelope
v2 for the gateway, ``{"error": {"code", "message"}}`` for the sidecar). A 5xx is judged by
:func:`judge`: a 500, or any 5xx whose code the route's ``/openapi.json`` entry does not list for that
status (``x-error-codes``), is a server error (goal 0); a documented coded 5xx (a kill switch's 503
``rag.media_disabled``, a model still loading) is counted apart as ``documented_unavailable``.

schemathesis installs here (4.32 with hypothesis 6.170) but only generates schema-shaped data; the
classes that found defects before (raw bytes, nesting, content types, oversized bodies) are outside
it, so these strategies are our own. Every run is bounded by a case count per route and a deadline.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

__all__ = [
    "CLASSES",
    "Case",
    "FuzzReport",
    "Outcome",
    "case_strategy",
    "classes_for",
    "documented_errors",
    "error_code",
    "fuzz_service",
    "judge",
    "send",
]

# The kinds of request each route gets; the report counts cases per class.
CLASSES = (
    "valid",
    "wrong_type",
    "missing_field",
    "extra_field",
    "huge_string",
    "empty_string",
    "control_chars",
    "lone_surrogate",
    "invalid_utf8",
    "deep_nesting",
    "number_limits",
    "content_type",
    "malformed_json",
    "oversized",
    "path_params",
    "query_junk",
)
_RAW = "\x00RAW{}\x00"  # a marker replaced by raw JSON text after serialization
_INVALID_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xe2\x82")
_NUMBERS = (0, -1, 1, 50, 51, 2**31 - 1, 2**31, 2**63, -(2**63) - 1, 1e308, -0.0, 0.5)
_RAW_NUMBERS = ("1e400", "9" * 5000, "-" + "9" * 4301, "NaN", "Infinity", "-Infinity", "1" + "0" * 400)
_ODD_TYPES = (
    "text/plain",
    "application/x-www-form-urlencoded",
    "application/xml",
    "multipart/form-data; boundary=x",
    "application/json; charset=utf-16",
    "application/octet-stream",
    "",
    "application/json\r\n",  # rejected by http.client: sent as a plain odd type instead
)
_MALFORMED = (b"", b"{", b"null", b"[]", b'"text"', b"{}}", b'{"a":}', b"\xef\xbb\xbf{}", b"{'a': 1}")


@dataclasses.dataclass(frozen=True)
class Case:
    klass: str
    route: str  # "METHOD /template"
    method: str
    path: str  # concrete, percent-encoded
    headers: tuple[tuple[str, str], ...]
    body: bytes | None

    def describe(self) -> str:
        body = (self.body or b"")[:160]
        return f"{self.klass}: {self.method} {self.path[:160]} {dict(self.headers)} body={body!r}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: int  # 0: no answer (connection dropped or timed out)
    problem: str | None  # why the answer breaks the contract, None when it keeps it


@dataclasses.dataclass
class FuzzReport:
    service: str
    cases: Counter = dataclasses.field(default_factory=Counter)  # route -> count
    classes: Counter = dataclasses.field(default_factory=Counter)  # class -> count
    statuses: Counter = dataclasses.field(default_factory=Counter)  # status -> count
    problems: list[str] = dataclasses.field(default_factory=list)  # reproducible descriptions
    server_errors: int = 0  # no answer, 500, or a 5xx undocumented for its route or uncoded (goal 0)
    # "status code" -> count: coded 5xx the route documents (a kill switch, a model not ready)
    documented_unavailable: Counter = dataclasses.field(default_factory=Counter)
    stopped_early: bool = False  # the deadline cut the run

    def as_dict(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "cases_per_route": dict(sorted(self.cases.items())),
            "cases_per_class": dict(sorted(self.classes.items())),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "server_errors": self.server_errors,
            "documented_unavailable": sum(self.documented_unavailable.values()),
            "documented_unavailable_codes": dict(sorted(self.documented_unavailable.items())),
            "contract_violations": len(self.problems),
            "examples": self.problems[:20],
            "stopped_early": self.stopped_early,
        }


# -- values from a JSON schema ---------------------------------------------------------------------


def _text() -> st.SearchStrategy[str]:
    words = st.sampled_from(["amphora", "coin", "water", "Entrevista", "oh1", "ánfora", "木簡", "x"])
    return st.one_of(st.lists(words, min_size=1, max_size=4).map(" ".join), st.text(max_size=12))


def from_schema(schema: dict[str, Any], hints: dict[str, list[Any]]) -> st.SearchStrategy[Any]:
    """Valid values for the subset of JSON Schema the two documents use; ``hints`` seed named fields."""
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return st.one_of([from_schema(s, hints) for s in schema[key]])
    if "allOf" in schema:
        return from_schema(schema["allOf"][-1], hints)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}, hints) for k in kind])
    if kind == "string":
        return _text()
    if kind == "integer":
        return st.integers(min_value=schema.get("minimum", 0), max_value=60)
    if kind == "number":
        return st.floats(min_value=0, max_value=1)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {"type": "string"}), hints), min_size=1, max_size=3)
    props: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", ()))

    def field(name: str, sub: dict[str, Any]) -> st.SearchStrategy[Any]:
        return st.sampled_from(hints[name]) if name in hints else from_schema(sub, hints)

    return st.fixed_dictionaries(
        {k: field(k, v) for k, v in props.items() if k in required},
        optional={k: field(k, v) for k, v in props.items() if k not in required},
    )


# -- hostile mutations of a valid body -------------------------------------------------------------


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key or index path into nested dicts and lists (the places a mutation can land)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    out = []
    for k, v in items:
        out.append((*prefix, k))
        out += _paths(v, (*prefix, k))
    return out


def _get(body: Any, path: tuple) -> Any:
    for key in path:
        body = body[key]
    return body


def _set(body: Any, path: tuple, value: Any) -> Any:
    """A copy of ``body`` with ``value`` at ``path`` (the empty path replaces the whole body)."""
    if not path:
        return value
    body = json.loads(json.dumps(body))
    target = body
    for key in path[:-1]:
        target = target[key]
    if isinstance(target, list) and not isinstance(path[-1], int):
        target.append({path[-1]: value})  # an extra key beside list items: a new item holding it
    else:
        target[path[-1]] = value
    return body


def _drop(body: Any, path: tuple) -> Any:
    if not path:
        return {}
    body = json.loads(json.dumps(body))
    target = body
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return body


def _encode(body: Any, raw: str | None = None) -> bytes:
    text = json.dumps(body)  # ensure_ascii: a lone surrogate becomes the escape "\ud800"
    if raw is not None:
        text = text.replace(json.dumps(_RAW), raw)
    return text.encode()


@st.composite
def _mutated(draw: st.DrawFn, valid: st.SearchStrategy[Any], klass: str, oversize: int) -> bytes:
    body = draw(valid)
    paths = _paths(body) or [()]
    where = draw(st.sampled_from(paths))
    if klass == "valid":
        return _encode(body)
    if klass == "wrong_type":
        other = draw(st.sampled_from([123, "x", [], {}, None, True, 1.5, [[1]], {"a": {"b": 1}}]))
        return _encode(_set(body, where, other))
    if klass == "missing_field":
        return _encode(_drop(body, where))
    if klass == "extra_field":
        name = draw(st.sampled_from(["zz_extra", "__proto__", "", "model\x00", "options"]))
        parents = [p for p in [(), *paths] if p == () or isinstance(_get(body, p), dict | list)]
        parent = draw(st.sampled_from(parents))
        if not isinstance(_get(body, parent), dict | list):
            return _encode({name: body})
        return _encode(_set(body, (*parent, name), draw(st.sampled_from([1, "x", {}, [None]]))))
    if klass == "huge_string":
        size = draw(st.sampled_from([70_000, 300_000, 1_000_000]))
        return _encode(_set(body, where, draw(st.sampled_from(["a", "é", "木 "])) * size))
    if klass == "empty_string":
        return _encode(_set(body, where, draw(st.sampled_from(["", " ", "\n", [""], [" "]]))))
    if klass == "control_chars":
        junk = draw(st.text(alphabet=st.characters(max_codepoint=0x1F), min_size=1, max_size=8))
        return _encode(_set(body, where, draw(st.sampled_from([junk, [junk], "a" + junk + "b"]))))
    if klass == "lone_surrogate":
        lone = draw(st.sampled_from(["\ud800", "\udfff", "a\udc00b", "\ud83d"]))
        return _encode(_set(body, where, draw(st.sampled_from([lone, [lone]]))))
    if klass == "invalid_utf8":
        raw = draw(st.sampled_from(_INVALID_UTF8))
        marked = _encode(_set(body, where, "@@BAD@@"))
        return marked.replace(b"@@BAD@@", raw)
    if klass == "deep_nesting":
        depth = draw(st.sampled_from([64, 1_000, 10_000, 100_000]))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        return _encode(_set(body, where, _RAW), opener * depth + "1" + closer * depth)
    if klass == "number_limits":
        if draw(st.booleans()):
            return _encode(_set(body, where, draw(st.sampled_from(_NUMBERS))))
        return _encode(_set(body, where, _RAW), draw(st.sampled_from(_RAW_NUMBERS)))
    if klass == "malformed_json":
        return draw(st.sampled_from(_MALFORMED)) if draw(st.booleans()) else _encode(body)[:-1]
    if klass == "oversized":
        return _encode(_set(body, where, "a" * oversize))
    return _encode(body)


# -- cases per operation ---------------------------------------------------------------------------


def _path_value() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["oh1", "1", "²", "٣", "0", "-1", "9" * 30, "..", "%00", "%ZZ", "%ff", "a" * 5000]),
        st.text(min_size=1, max_size=20),
    )


def _concrete(template: str, values: dict[str, str]) -> str:
    out = template
    for name, value in values.items():
        # Pre-encoded junk ("%ZZ") is sent as is; everything else percent-encoded.
        encoded = value if value.startswith("%") else quote(value.encode("utf-8", "surrogatepass"), safe="")
        out = out.replace("{" + name + "}", encoded)
    return out


def classes_for(method: str, operation: dict[str, Any]) -> list[str]:
    """The classes that apply to an operation: bodies only where it takes one, ids where it has some."""
    params = any(p.get("in") == "path" for p in operation.get("parameters", []))
    out = ["valid", "query_junk"] + (["path_params"] if params else [])
    if "requestBody" in operation or method.lower() in ("post", "put", "patch"):
        out += [c for c in CLASSES if c not in ("valid", "path_params", "query_junk")]
    return out


def case_strategy(
    method: str,
    template: str,
    operation: dict[str, Any],
    klass: str,
    *,
    headers: dict[str, str],
    hints: dict[str, list[Any]],
    oversize: int,
) -> st.SearchStrategy[Case]:
    """Cases of one class for one operation."""
    route = f"{method.upper()} {template}"
    params = [p["name"] for p in operation.get("parameters", []) if p.get("in") == "path"]
    content = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    has_body = "requestBody" in operation or method.lower() in ("post", "put", "patch")
    valid = from_schema(content.get("schema", {"type": "object"}), hints) if has_body else None

    @st.composite
    def one(draw: st.DrawFn) -> Case:
        values = {p: draw(_path_value()) if klass == "path_params" else "oh1" for p in params}
        path = _concrete(template, values)
        if klass == "query_junk":
            junk = draw(
                st.sampled_from(["?a=1", "?%ff=%00", "?" + "x" * 9000, "?limit=99999999999", "?;;&&=="])
            )
            path += junk
        sent = dict(headers)
        body = None
        if valid is not None:
            body = draw(
                _mutated(valid, "valid" if klass in ("path_params", "query_junk") else klass, oversize)
            )
            sent["Content-Type"] = "application/json"
            if klass == "content_type":
                sent["Content-Type"] = draw(st.sampled_from(_ODD_TYPES)).strip()
        return Case(klass, route, method.upper(), path, tuple(sent.items()), body)

    return one()


# -- sending and checking --------------------------------------------------------------------------


def send(base_url: str, case: Case, timeout: float) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh loopback connection; status 0 when no answer came back."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.putrequest(case.method, case.path, skip_accept_encoding=True)
        for name, value in case.headers:
            if value or name.lower() != "content-type":
                conn.putheader(name, value)
        if case.body is not None:
            conn.putheader("Content-Length", str(len(case.body)))
        conn.endheaders(case.body)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    except (OSError, http.client.HTTPException):
        return 0, {}, b""
    finally:
        conn.close()


def gateway_contract(status: int, headers: dict[str, str], body: bytes, path: str) -> str | None:
    """Envelope v2 on every answer of a JSON route; a coded error on every failure."""
    route = path.split("?")[0]
    if status == 200 and route in ("/metrics", "/openapi.json", "/healthz", "/readyz"):
        return None
    # The console's and the docs' pages and files (HTML, scripts, styles); their failures are envelopes.
    if status == 200 and route.split("/")[1] in ("console", "docs"):
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return f"{status} answer is not JSON: {body[:80]!r}"
    # OpenAI's lists: gateway.web.embeddings answers OpenAI's shapes, for OpenAI clients.
    if status == 200 and route in ("/v1/embeddings", "/v1/models"):
        listed = isinstance(payload, dict) and payload.get("object") == "list"
        return None if listed else f"200 answer is not an OpenAI list: {body[:120]!r}"
    if not isinstance(payload, dict) or not isinstance(payload.get("request_id"), str):
        return f"{status} answer is not envelope v2 (no request_id): {body[:120]!r}"
    if status >= 400:
        error = payload.get("error")
        keys = {"code", "category", "message", "label_key", "retryable"}
        if payload.get("ok") is not False or not isinstance(error, dict) or not keys <= error.keys():
            return f"{status} error is not envelope v2: {body[:160]!r}"
    elif payload.get("ok") is not True:
        return f"{status} success without ok: true: {body[:120]!r}"
    retryable = status >= 400 and payload["error"]["retryable"] is True
    if (status == 429 or (status == 503 and retryable)) and "retry-after" not in headers:
        return f"{status} without Retry-After"
    return None


def sidecar_contract(status: int, headers: dict[str, str], body: bytes, path: str) -> str | None:
    """``{"error": {"code", "message"}}`` on every failure; JSON on every JSON route."""
    if status < 400:
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return f"{status} answer is not JSON: {body[:80]!r}"
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("code"), str) or "message" not in error:
        return f"{status} error is not {{'error': {{'code', 'message'}}}}: {body[:160]!r}"
    if status in (429, 503) and "retry-after" not in headers:
        return f"{status} without Retry-After"
    return None


Contract = Callable[[int, dict[str, str], bytes, str], str | None]


def documented_errors(operation: dict[str, Any]) -> dict[int, frozenset[str]]:
    """status -> the error codes an operation's ``/openapi.json`` entry lists for it (``x-error-codes``)."""
    out: dict[int, frozenset[str]] = {}
    for status, response in operation.get("responses", {}).items():
        if status.isdigit() and isinstance(response, dict):
            out[int(status)] = frozenset(response.get("x-error-codes") or ())
    return out


def error_code(body: bytes) -> str | None:
    """The ``error.code`` of an answer in either service's error shape; None when it has none."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def judge(
    status: int,
    headers: dict[str, str],
    body: bytes,
    path: str,
    documented: dict[int, frozenset[str]],
    contract: Contract,
) -> tuple[str, str | None]:
    """(kind, problem) for one answer. kind: "ok" (below 500), "documented_unavailable" (a coded 5xx
    the route documents, in the service's error shape), or "server_error" (no answer, a 500, an
    undocumented or uncoded 5xx, or a documented one breaking the error shape)."""
    if status == 0:
        return "server_error", "no answer (connection dropped or timed out)"
    problem = contract(status, headers, body, path)
    if status < 500:
        return "ok", problem
    code = error_code(body)
    if status == 500 or code is None or code not in documented.get(status, frozenset()):
        return "server_error", f"{status} {code or 'uncoded'} not documented for this route: {body[:160]!r}"
    return ("server_error" if problem else "documented_unavailable"), problem


class _Deadline(Exception):
    pass


def _runner(
    base_url: str,
    strategy: st.SearchStrategy[Case],
    report: FuzzReport,
    contract: Contract,
    documented: dict[int, frozenset[str]],
    cases: int,
    deadline: float,
    timeout: float,
) -> Callable[[], None]:
    """A hypothesis test for one operation that sends each drawn case and records its outcome."""

    @settings(
        max_examples=cases,
        database=None,
        deadline=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def run(data: st.DataObject) -> None:
        if time.monotonic() > deadline:
            raise _Deadline
        case = data.draw(strategy)
        status, answer_headers, body = send(base_url, case, timeout)
        report.cases[case.route] += 1
        report.classes[case.klass] += 1
        report.statuses[status] += 1
        kind, problem = judge(status, answer_headers, body, case.path, documented, contract)
        if kind == "server_error":
            report.server_errors += 1
        elif kind == "documented_unavailable":
            report.documented_unavailable[f"{status} {error_code(body)}"] += 1
        if problem:
            report.problems.append(f"{problem} <- {case.describe()}")

    return run


def fuzz_service(
    base_url: str,
    spec: dict[str, Any],
    *,
    service: str,
    contract: Contract,
    headers: dict[str, str],
    hints: dict[str, list[Any]],
    cases_per_route: int,
    seconds: float,
    oversize: int,
    timeout: float = 120.0,
) -> FuzzReport:
    """Fuzz every operation of ``spec`` at ``base_url`` (blocking: run it off an event loop)."""
    report = FuzzReport(service)
    deadline = time.monotonic() + seconds
    for template, operations in spec["paths"].items():
        for method, operation in operations.items():
            classes = classes_for(method, operation)
            # One hypothesis run per class: every class gets its share of a small budget.
            per_class = max(1, -(-cases_per_route // len(classes)))
            for klass in classes:
                strategy = case_strategy(
                    method, template, operation, klass, headers=headers, hints=hints, oversize=oversize
                )
                documented = documented_errors(operation)
                run = _runner(base_url, strategy, report, contract, documented, per_class, deadline, timeout)
                try:
                    run()
                except _Deadline:
                    report.stopped_early = True
                    return report
    return report
