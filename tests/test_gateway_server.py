"""The gateway's listener while stopping: no handshake completes after the backlog is swept."""

from __future__ import annotations

import socket
import sys

import pytest

from gateway.web.server import refuse_new_handshakes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="socket filters are Linux's")
def test_a_listener_refusing_new_handshakes_keeps_its_backlog_then_refuses() -> None:
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = listener.getsockname()
        queued = socket.create_connection(address, timeout=5)  # completed before: in the backlog
        assert refuse_new_handshakes(listener)
        with pytest.raises(TimeoutError):  # its SYN is dropped: no connection the close would reset
            socket.create_connection(address, timeout=0.3)
        accepted, _ = listener.accept()  # the backlog is still there to be served
        accepted.close()
        queued.close()
    finally:
        listener.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=5)


async def test_a_connection_accepted_just_before_the_stop_is_served_not_reset() -> None:
    """asyncio accepts in one loop iteration and builds the transport in the next; a stop that lands
    between the two must still serve the request (the closed server used to drop it, resetting it)."""
    import asyncio

    from aiohttp import web

    from gateway.web.server import GatewayRunner

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="served")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = GatewayRunner(app, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    address = runner.addresses[0]
    client = socket.create_connection(address, timeout=5)  # the kernel completes it at once
    try:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        # Iteration 1 runs this task, then asyncio's accept callback, which queues the transport task
        # behind this task's next step; iteration 2 then starts the stop before that task runs.
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await runner.cleanup()
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    finally:
        client.close()
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"served"), answer
