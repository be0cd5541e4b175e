"""Structured logs: one JSON object per line, each carrying the request id of its request.

The request id lives in a context variable set by the observing middleware,
so any log line emitted while serving a request (retrieval, database, intake)
carries it without threading it through calls.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from typing import Any

import orjson

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("mnemo_request_id", default=None)

# LogRecord attributes that are not user-supplied `extra` fields.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "request_id"}


class RequestIdFilter(logging.Filter):
    """Stamp every record with the current request id (or None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "request_id", ...extra}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid:
            out["request_id"] = rid
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        try:  # orjson: the access log writes a line per request (issue 27)
            return orjson.dumps(out, default=str).decode()
        except orjson.JSONEncodeError:  # an integer past 64 bits and the like: json writes those
            return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(fmt: str = "json", level: str | int = "INFO") -> None:
    """Route the root logger to stderr as JSON lines (``fmt="json"``) or plain text."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")
        )
    # Neither format shows a record's thread, process or calling function: leave them uncomputed
    # (the switches of the logging HOWTO's "Optimization" section). The caller's lookup walks the
    # stack for every record, and the gateway writes one access line per request (issue 15).
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else getattr(logging, str(level).upper(), logging.INFO))
