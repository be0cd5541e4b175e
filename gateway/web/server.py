"""The gateway's HTTP server settings against hostile clients: timeouts, cancellation, a concurrency bound.

- **Slow or idle connections.** aiohttp's keep-alive timer starts when a
  connection opens and again after each response, and closes the connection
  when no complete request head has arrived by then. ``RAG_GATEWAY_IDLE_TIMEOUT``
  sets it, so it bounds both an idle keep-alive connection and a client that
  sends its request line and headers one byte at a time (aiohttp has no
  separate header timeout). The body has its own deadline in
  :func:`gateway.base.body.read_json` (``RAG_GATEWAY_BODY_TIMEOUT``).
- **Clients that hang up.** :class:`GatewayRunner` turns on aiohttp's handler
  cancellation: when the connection drops, the handler task is cancelled, so a
  pending sidecar call or query stops instead of running for nobody. The
  access log records it as ``client_abort`` (:mod:`gateway.web.observe`).
- **Protocol errors.** A request aiohttp cannot parse (a header line over the
  limit, a malformed request line) is answered in envelope v2 like every
  other failure, not aiohttp's plain text.
- **Load.** :func:`concurrency_middleware` answers 429 ``service.overloaded``
  with ``Retry-After`` beyond ``RAG_GATEWAY_MAX_CONCURRENCY`` requests in
  flight, rather than queueing without bound.
- **Stopping (SIGTERM).** :meth:`GatewayRunner.cleanup` replaces aiohttp's
  shutdown, which closed every connection at once: data arriving on them was
  then ignored, so a request whose body was still in transit, or a request
  sent on a kept-alive connection, got no answer, and connections waiting in
  the listen backlog were reset when the socket closed. Instead: (1) stop new
  handshakes (:func:`refuse_new_handshakes`), accept what is in the backlog,
  then close the listening socket, so later clients are refused (connection
  refused, after one SYN retry) and can go elsewhere; (2) every request
  already read, and the first request of every connection opened before the
  stop, is served, with ``Connection: close``; (3) any other request arriving
  on a kept-alive connection while draining gets 503 ``service.stopping``
  (retryable, ``Retry-After``, ``Connection: close``); (4) idle connections are
  closed once no request is in progress and :data:`DRAIN_GRACE_S` has passed,
  and requests still running at ``RAG_SHUTDOWN_TIMEOUT`` are cancelled.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import socket
import struct
import sys
import time
import uuid
from typing import Any

from aiohttp import web
from aiohttp.web_request import BaseRequest

from gateway.base.errors import REQUEST_ID_HEADER, ApiError, Handler, error_response
from gateway.base.settings import GatewaySettings
from inference.http_protocol import JsonProtocolErrors, ProtocolRunner
from inference.json_out import dumps

__all__ = [
    "DRAIN_GRACE_S",
    "UNBOUNDED_PATHS",
    "GatewayRunner",
    "concurrency_middleware",
    "handler_args",
    "refuse_new_handshakes",
]

log = logging.getLogger(__name__)

# Probes and scrapes must answer while the gateway is saturated: they are never refused.
UNBOUNDED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

# While stopping, idle connections stay open at least this long (capped by the shutdown timeout), so
# a request already on its way over one is answered (served, or refused with a coded 503) rather than
# met by a closed socket. They stay open longer while any request is still in progress.
DRAIN_GRACE_S = 0.5
_DRAIN_POLL_S = 0.02


def handler_args(settings: GatewaySettings) -> dict[str, Any]:
    """Per-connection options (``web.Application(handler_args=...)``)."""
    return {
        "keepalive_timeout": settings.idle_timeout,
        # After an answer sent before the body was read (a 408, 413 or 415), aiohttp reads and drops the
        # rest for up to this long so the client sees the answer, not a reset; 10 s by default would
        # hand a slow-loris body that much more time.
        "lingering_time": min(2.0, settings.body_timeout),
        # The body reader inflates gzip itself, within the byte limit and with a coded error;
        # aiohttp's decoder would drop the connection on a body that is not gzip.
        "auto_decompress": False,
    }


class _EnvelopeProtocol(JsonProtocolErrors):
    """aiohttp's connection handler, answering its own protocol errors in envelope v2 and draining
    politely when the gateway stops (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._requests_seen = 0
        self._draining = False
        self._drain_allowance = 0  # requests this connection may still have served while draining

    def start_draining(self) -> None:
        """Serve what was read or is the connection's first request; refuse later ones; then close."""
        self._draining = True
        # requests already parsed here were read before the stop; a fresh connection's first is in transit
        self._drain_allowance = len(self._messages) or (1 if self._requests_seen == 0 else 0)

    @property
    def busy(self) -> bool:
        """A request is being handled or waits (parsed) on this connection."""
        return self._request_in_progress or bool(self._messages)

    @property
    def open(self) -> bool:
        return self.transport is not None and not self._force_close

    async def _handle_request(self, request: BaseRequest, start_time: Any, request_handler: Any) -> Any:
        self._requests_seen += 1
        if self._draining:
            if self._drain_allowance > 0:
                self._drain_allowance -= 1
            else:
                request_handler = _refuse_while_stopping
        return await super()._handle_request(request, start_time, request_handler)

    async def finish_response(self, request: BaseRequest, resp: web.StreamResponse, start_time: Any) -> Any:
        if self._draining:  # the last answer on this connection: say so, so the client opens no reuse
            resp.force_close()
        return await super().finish_response(request, resp, start_time)

    def protocol_error_response(self, status: int, reason: str | None) -> web.Response:
        if reason is None:
            error = ApiError.internal()
        else:
            code = {413: "request.payload_too_large", 408: "request.timeout"}.get(
                status, "request.invalid_request"
            )
            error = ApiError(code, f"The HTTP request is malformed ({status}: {reason})")
        rid = uuid.uuid4().hex
        response = web.Response(
            status=error.status, body=dumps(error.body(rid)), content_type="application/json", charset="utf-8"
        )
        response.headers[REQUEST_ID_HEADER] = rid
        return response


async def _refuse_while_stopping(request: BaseRequest) -> web.StreamResponse:
    error = ApiError("service.stopping")
    response = error_response(request, error)
    response.force_close()
    return response


class GatewayRunner(ProtocolRunner):
    """``web.AppRunner`` with handler cancellation on and envelope-v2 protocol errors.

    Serve the gateway with it (``serve()`` and the test fixture do), not a bare ``AppRunner``.
    """

    protocol = _EnvelopeProtocol

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("handler_cancellation", True)
        super().__init__(app, **kwargs)

    async def cleanup(self) -> None:
        """Stop: backlog accepted and listener closed, in-flight requests finished, then the app's cleanup.

        aiohttp's own ``cleanup`` closes every connection before waiting, which drops requests in
        transit; this keeps its order (sites, on_shutdown, connections, cleanup contexts) otherwise.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._shutdown_timeout
        accepted: list[socket.socket] = []
        for site in list(self._sites):
            accepted += await _close_listener(site)
            await site.stop()
        server = self._server
        if server is not None:
            for sock in accepted:  # clients that connected before the stop: served like the others
                try:
                    await loop.connect_accepted_socket(server, sock)
                except OSError:
                    sock.close()
            await asyncio.sleep(0)
            await _drain(server, deadline, min(DRAIN_GRACE_S, self._shutdown_timeout))
            await self.shutdown()
            await server.shutdown(max(0.0, deadline - loop.time()))
        await self._cleanup_server()
        self._server = None


async def _close_listener(site: web.BaseSite) -> list[socket.socket]:
    """Close the site's listening sockets, first accepting the connections queued in their backlog.

    Closing a listening socket resets the connections the kernel completed but nobody accepted yet,
    though their clients may have sent a whole request. A duplicate descriptor keeps the socket
    listening while asyncio lets go of it. First :func:`refuse_new_handshakes`: otherwise a client
    whose handshake completes between the last ``accept`` and the close (a window that grows to
    milliseconds when the OS preempts this process) is reset after sending its request. Handshakes
    already under way when the filter goes on still complete, so the sweep waits for the backlog to
    stay empty a moment (:func:`_sweep_backlogs`) before the close.

    asyncio accepts in one callback and builds each connection's transport in a task that runs a loop
    iteration later; a task still pending when ``Server.close`` runs fails (the closed server refuses
    to count it) and asyncio drops the accepted socket without a word, resetting a client that had
    sent its request. So asyncio stops accepting first, those tasks run, and only then is the server
    closed.
    """
    server = getattr(site, "_server", None)
    listeners = list(getattr(server, "sockets", None) or ())
    dups = []
    for listener in listeners:
        dup = socket.socket(fileno=os.dup(listener.fileno()))
        dup.setblocking(False)
        refuse_new_handshakes(dup)
        dups.append(dup)
    if server is not None:
        loop = asyncio.get_running_loop()
        for listener in listeners:
            loop.remove_reader(listener.fileno())  # asyncio accepts no more
        for _ in range(2):  # the transport tasks of what it accepted last run before we go on
            await asyncio.sleep(0)
        server.close()  # the duplicates still hold the sockets open
    accepted = _sweep_backlogs(dups)
    for dup in dups:
        dup.close()
    if accepted:
        log.info("stopping: %d connection(s) taken from the listen backlog", len(accepted))
    return accepted


def _sweep_backlogs(listeners: list[socket.socket]) -> list[socket.socket]:
    """Accept every queued connection, until the backlogs stay empty for ``_SWEEP_QUIET_S``."""
    accepted: list[socket.socket] = []
    started = quiet_since = time.monotonic()
    while True:
        for listener in listeners:
            try:
                while True:
                    conn, _ = listener.accept()
                    accepted.append(conn)
                    quiet_since = time.monotonic()
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:  # e.g. EMFILE: what is left in the backlog is reset, as before
                log.warning("stopping: could not accept the listen backlog: %s", exc)
                return accepted
        now = time.monotonic()
        if now - quiet_since >= _SWEEP_QUIET_S or now - started >= _SWEEP_MAX_S:
            return accepted
        time.sleep(0.002)


_SO_ATTACH_FILTER = 26  # <asm-generic/socket.h>
# A classic BPF program run on each TCP segment that reaches the listener (skb data starts at the TCP
# header): keep a segment with the ACK flag, drop one without it. A fresh SYN has no ACK and is
# dropped; the ACK that completes a handshake already under way goes through, so that connection
# lands in the backlog to be swept instead of being reset by the close. (Dropping every segment also
# dropped those ACKs: a client whose handshake was in flight at the stop saw it complete, sent its
# request, and met a reset.)
_SYN_DROP_FILTER = (
    (0x30, 0, 0, 13),  # BPF_LD | BPF_B | BPF_ABS: A = TCP flags (byte 13 of the header)
    (0x45, 0, 1, 0x10),  # BPF_JMP | BPF_JSET | BPF_K: A & ACK? keep : drop
    (0x06, 0, 0, 0xFFFFFFFF),  # BPF_RET | BPF_K: keep the whole segment
    (0x06, 0, 0, 0),  # BPF_RET | BPF_K: drop it
)
# After the filter is on, handshakes already under way finish within microseconds on an idle host;
# the backlog is swept until it has stayed empty this long (bounded by _SWEEP_MAX_S).
_SWEEP_QUIET_S = 0.02
_SWEEP_MAX_S = 0.2


def refuse_new_handshakes(sock: socket.socket) -> bool:
    """Make a listening TCP socket drop new SYNs (Linux: a socket filter keeping only ACK segments).

    The kernel then starts no new connection; a client's SYN goes unanswered and its retry (after
    about a second) meets the closed port: connection refused, before it sent anything. Handshakes
    already under way complete into the backlog, and connections there stay to be accepted. False
    where the platform has no socket filters (the close then races as without it).
    """
    if not sys.platform.startswith("linux"):
        return False
    program = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in _SYN_DROP_FILTER))
    fprog = struct.pack("HL", len(_SYN_DROP_FILTER), ctypes.addressof(program))  # struct sock_fprog
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    except OSError as exc:
        log.warning("stopping: could not stop new handshakes on the listener: %s", exc)
        return False
    return True


async def _drain(server: web.Server, deadline: float, grace: float) -> None:
    """Let every connection finish (see :class:`_EnvelopeProtocol`); close idle ones after ``grace``.

    Returns when no connection is open, or when none is busy and ``grace`` has passed, or at
    ``deadline`` (the caller then cancels what still runs).
    """
    loop = asyncio.get_running_loop()
    grace_end = loop.time() + grace
    for conn in server.connections:
        if isinstance(conn, _EnvelopeProtocol):
            conn.start_draining()
    while loop.time() < deadline:
        # Sleep first: a connection asyncio accepted just before the stop gets its protocol two loop
        # iterations later; counting connections at once would miss it, end the drain, and drop it.
        await asyncio.sleep(_DRAIN_POLL_S)
        conns = [c for c in server.connections if isinstance(c, _EnvelopeProtocol) and c.open]
        for conn in conns:  # accepted from the backlog, or by asyncio just before the stop
            if not conn._draining:
                conn.start_draining()
        if not conns or (loop.time() >= grace_end and not any(c.busy for c in conns)):
            break
    for conn in server.connections:
        if isinstance(conn, _EnvelopeProtocol) and conn.open and not conn.busy:
            conn.force_close()


def concurrency_middleware(limit: int) -> Any:
    """Refuse (429) beyond ``limit`` requests in flight, probes and metrics excepted."""
    in_flight = 0

    @web.middleware
    async def bound(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal in_flight
        if request.path in UNBOUNDED_PATHS:
            return await handler(request)
        if in_flight >= limit:
            raise ApiError("service.overloaded", f"More than {limit} requests in flight; retry shortly")
        in_flight += 1
        try:
            return await handler(request)
        finally:
            in_flight -= 1

    return bound
