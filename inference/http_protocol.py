"""aiohttp plumbing shared by Mnemo's two HTTP servers (the sidecar's front and the gateway).

aiohttp answers a request it cannot parse (a request line or header over 8 KiB, bad framing) before
any handler runs, in plain text. :class:`JsonProtocolErrors` is the connection handler that answers
it in the server's own JSON envelope instead; :class:`ProtocolRunner` is the ``web.AppRunner`` that
gives every connection such a handler. Each server supplies only its envelope
(:meth:`JsonProtocolErrors.protocol_error_response`).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

__all__ = ["JsonProtocolErrors", "ProtocolRunner", "parse_error_reason"]

log = logging.getLogger(__name__)


def parse_error_reason(exc: BaseException | None, message: str | None) -> str:
    """A short reason for a parse failure; aiohttp's messages quote the client's bytes, so cut them."""
    text = getattr(exc, "message", None) or message or type(exc).__name__
    text = str(text).splitlines()[0] if str(text) else "bad request"
    return text[:120]


class JsonProtocolErrors(RequestHandler):
    """aiohttp's connection handler, answering its own protocol errors through
    :meth:`protocol_error_response` (and closing the connection: its framing is unknown)."""

    def protocol_error_response(self, status: int, reason: str | None) -> web.Response:
        """The answer to a protocol error: ``reason`` is None for a server fault (status >= 500)."""
        raise NotImplementedError

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # a response already started: nothing sensible to send
            raise ConnectionError("response already sent; cannot send an error")
        reason = None
        if status >= 500:
            self.log_exception("error handling request from %s", request.remote, exc_info=exc)
        else:  # the client's bytes are at fault: one line, no traceback
            log.warning("malformed request from %s: %s", request.remote, message or exc)
            reason = parse_error_reason(exc, message)
        response = self.protocol_error_response(status, reason)
        response.force_close()
        return response


class _ProtocolServer(web.Server):
    def __init__(self, protocol: type[RequestHandler], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._protocol = protocol

    def __call__(self) -> RequestHandler:
        return self._protocol(self, loop=self._loop, **self._kwargs)


class ProtocolRunner(web.AppRunner):
    """``web.AppRunner`` whose connections are handled by ``protocol`` (a subclass sets it)."""

    protocol: ClassVar[type[RequestHandler]]

    async def _make_server(self) -> web.Server:
        base = await super()._make_server()
        # Same handler, factory and options; only the per-connection protocol class differs.
        kwargs: dict[str, Any] = base._kwargs
        return _ProtocolServer(
            self.protocol,
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            **kwargs,
        )
