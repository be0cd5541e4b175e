"""The gateway's listener while stopping: no handshake completes after the backlog is swept."""

from __future__ import annotations

import socket
import sys

import pytest

from gateway.server import refuse_new_handshakes


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
