"""The sidecar's request contract as data: a :class:`Route` per endpoint, a :class:`Field` per body field.

One declaration gives every view of a route: the request a client sends (:meth:`Route.body`, what
:mod:`inference.client` builds), the request validation (:meth:`Route.read`, what the route's handler
receives, or the first invalid field as a coded 4xx) and its OpenAPI request schema
(:meth:`Route.request_schema`, what ``GET /openapi.json`` publishes). The table of routes is
:data:`inference.routes.ROUTES`; ``tests/test_inference_contract.py`` proves the views agree.

A declaration is pure data, with no handler and nothing of the server: the client imports it, and
the gateway imports the client. What each route does is :data:`inference.handlers.HANDLERS`.

What a schema cannot say statically (which models are served, a model's kind, its per-request input
count) is checked here too, against the configuration, and written into the field's schema as
``x-model-kinds`` and its description.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .errors import BadRequest, ErrorCode, ModelNotFound, PayloadTooLarge

if TYPE_CHECKING:  # the server's configuration, read by Route.read; the client never loads it
    from .config import SidecarConfig

__all__ = ["Args", "Field", "FieldType", "Route"]

Args = dict[str, Any]  # a request's fields as its handler takes them: name -> validated value


class FieldType(StrEnum):
    """A field's wire type: what :meth:`Field.read` accepts and :meth:`Field.json_schema` publishes."""

    MODEL = "model"  # the id of a served model of one of the field's model kinds
    STRING = "string"
    BOOLEAN = "boolean"
    INTEGER = "integer"  # a JSON integer, never a boolean
    TEXTS = "texts"  # one string, or a non-empty list of strings (TEI and OpenAI clients send both)
    IMAGES = "images"  # a non-empty list, each item a base64 image (decoded by the handler, with its limits)


# The JSON Schema of each type, before a field's own limits, default and description.
_TYPE_SCHEMAS: Mapping[FieldType, Mapping[str, Any]] = {
    FieldType.MODEL: {"type": "string"},
    FieldType.STRING: {"type": "string"},
    FieldType.BOOLEAN: {"type": "boolean"},
    FieldType.INTEGER: {"type": "integer"},
    FieldType.TEXTS: {
        "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]
    },
    FieldType.IMAGES: {
        "type": "array",
        "items": {"type": "string", "contentEncoding": "base64"},
        "minItems": 1,
    },
}
# What a value of the wrong type is told, after the field's name.
_TYPE_ERRORS: Mapping[FieldType, str] = {
    FieldType.MODEL: "must be of type str",
    FieldType.STRING: "must be of type str",
    FieldType.BOOLEAN: "must be of type bool",
    FieldType.INTEGER: "must be of type int",
    FieldType.TEXTS: "must be a string or a list of strings",
    FieldType.IMAGES: "must be a list of base64 strings",
}
_COUNTED_NOTE = " At most the model's max_client_batch items per request (more is a 413 too_many_inputs)."


def _typed(kind: FieldType, value: Any) -> Any:
    """``value`` as ``kind`` (a bare string as a one-item list of texts), or None when it is not one."""
    if kind in (FieldType.MODEL, FieldType.STRING):
        return value if isinstance(value, str) else None
    if kind is FieldType.BOOLEAN:
        return value if isinstance(value, bool) else None
    if kind is FieldType.INTEGER:  # bool is an int subclass: a count is never a boolean
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind is FieldType.TEXTS:
        if isinstance(value, str):
            return [value]
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None
    return value if isinstance(value, list) else None  # IMAGES: each item is checked as it is decoded


@dataclass(frozen=True)
class Field:
    """One body field: its name, type, requiredness, default, limits and description."""

    name: str
    type: FieldType
    description: str
    required: bool = False
    default: Any = None  # what the handler gets when the field is absent or null
    choices: tuple[str, ...] = ()  # STRING: the values allowed; another is a 400 of ``choice_code``
    choice_code: ErrorCode = ErrorCode.INVALID_TYPE
    model_kinds: tuple[str, ...] = ()  # MODEL: the model kinds the route serves (another: wrong_model_kind)
    counted: bool = False  # TEXTS, IMAGES: at most the model's ``max_client_batch`` items (413 above)

    def __post_init__(self) -> None:
        # A declaration that could not be enforced as written is refused when the table is built.
        if self.required and self.default is not None:
            raise ValueError(f"field {self.name!r}: a required field has no default")
        if self.choices and (self.type is not FieldType.STRING or self.default not in (None, *self.choices)):
            raise ValueError(f"field {self.name!r}: choices are for strings, and include the default")
        if (self.type is FieldType.MODEL) != bool(self.model_kinds):
            raise ValueError(f"field {self.name!r}: model kinds go with a MODEL field, and it needs some")
        if self.counted and self.type not in (FieldType.TEXTS, FieldType.IMAGES):
            raise ValueError(f"field {self.name!r}: only a list of inputs is counted")

    def read(self, body: Mapping[str, Any]) -> Any:
        """The field's value from ``body`` (null reads as absent), or a coded 400 naming the field."""
        raw = body.get(self.name)
        if raw is None:
            if self.required:
                raise BadRequest(f"'{self.name}' is required", code=ErrorCode.MISSING_FIELD)
            return self.default
        value = _typed(self.type, raw)
        if value is None:
            raise BadRequest(f"'{self.name}' {_TYPE_ERRORS[self.type]}", code=ErrorCode.INVALID_TYPE)
        if isinstance(value, list) and not value:
            raise BadRequest(f"'{self.name}' is empty", code=ErrorCode.EMPTY_INPUT)
        if self.choices and value not in self.choices:
            allowed = " or ".join(f"'{choice}'" for choice in self.choices)
            raise BadRequest(f"'{self.name}' must be {allowed}", code=self.choice_code)
        return value

    def json_schema(self) -> dict[str, Any]:
        """The field as JSON Schema: what :meth:`read` accepts, told to clients."""
        schema: dict[str, Any] = dict(_TYPE_SCHEMAS[self.type])
        if self.choices:
            schema["enum"] = list(self.choices)
        if self.default is not None:
            schema["default"] = self.default
        if self.model_kinds:
            schema["x-model-kinds"] = list(self.model_kinds)
        schema["description"] = self.description + (_COUNTED_NOTE if self.counted else "")
        return schema


def _served_model(field: Field, model: str, config: SidecarConfig, served: Collection[str]) -> None:
    """A model id names a served model of one of ``field``'s kinds: else 404, or 400 wrong_model_kind."""
    if model not in served:
        raise ModelNotFound(f"model {model!r} is not served (GET /models lists them)")
    kind = config.model(model).kind
    if kind not in field.model_kinds:
        raise BadRequest(
            f"model {model!r} is a {kind} model; this route needs {' or '.join(field.model_kinds)}",
            code=ErrorCode.WRONG_MODEL_KIND,
        )


def _within_count(model: str, count: int, config: SidecarConfig) -> None:
    limit = config.model(model).max_client_batch
    if count > limit:
        raise PayloadTooLarge(
            f"{count} inputs; model {model!r} takes at most {limit} per request",
            code=ErrorCode.TOO_MANY_INPUTS,
        )


@dataclass(frozen=True)
class Route:
    """One endpoint: method, path, summary and, for a POST, its body's fields."""

    method: str  # "GET" or "POST"
    path: str
    summary: str
    fields: tuple[Field, ...] = ()  # in the order they are validated: the first bad one is answered
    open: bool = False  # answered without the API key (the probes and this contract's own document)

    def __post_init__(self) -> None:
        if self.method not in ("GET", "POST") or (self.fields and self.method != "POST"):
            raise ValueError(f"{self.method} {self.path}: GET or POST, and only a POST has body fields")
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.method} {self.path} declares a field twice: {names}")
        models = [i for i, f in enumerate(self.fields) if f.type is FieldType.MODEL]
        counted = [i for i, f in enumerate(self.fields) if f.counted]
        if len(models) > 1 or (counted and not (models and self.fields[models[0]].required)):
            raise ValueError(f"{self.method} {self.path}: counted inputs need the one required model field")
        if counted and min(counted) < models[0]:
            raise ValueError(f"{self.method} {self.path}: the model is read before the inputs it counts")

    @property
    def model_kinds(self) -> tuple[str, ...]:
        """The model kinds this route serves: its model field's (none for a route without one)."""
        return next((f.model_kinds for f in self.fields if f.type is FieldType.MODEL), ())

    def field(self, name: str) -> Field:
        """The declared field ``name`` (a client takes its defaults from here)."""
        for field in self.fields:
            if field.name == name:
                return field
        raise KeyError(f"{self.method} {self.path} declares no field {name!r}")

    def body(self, **values: Any) -> dict[str, Any]:
        """The request body a client sends: ``values`` in declaration order, a None left out (the
        server reads an absent field and a null alike). A name the route does not declare, or a
        required field left out, is refused here, before anything is sent."""
        unknown = sorted(set(values) - {f.name for f in self.fields})
        if unknown:
            raise ValueError(f"{self.method} {self.path} declares no field {unknown}")
        body = {f.name: values[f.name] for f in self.fields if values.get(f.name) is not None}
        missing = [f.name for f in self.fields if f.required and f.name not in body]
        if missing:
            raise ValueError(f"{self.method} {self.path} requires {missing}")
        return body

    def read(self, body: Mapping[str, Any], config: SidecarConfig, served: Collection[str]) -> Args:
        """The body's fields as the handler takes them, validated in declaration order."""
        args: Args = {}
        model: str | None = None
        for field in self.fields:
            value = field.read(body)
            if field.type is FieldType.MODEL and value is not None:
                _served_model(field, value, config, served)
                model = value
            if field.counted and value is not None and model is not None:
                _within_count(model, len(value), config)
            args[field.name] = value
        return args

    def request_schema(self) -> dict[str, Any]:
        """The body as a JSON Schema object (unknown fields are ignored, so it stays open)."""
        return {
            "type": "object",
            "required": [f.name for f in self.fields if f.required],
            "properties": {f.name: f.json_schema() for f in self.fields},
        }
