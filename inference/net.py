"""Small loopback helpers shared by every launcher, CLI, benchmark and test: free ports and readiness.

One copy of each, so that a fix (a timeout, a better error) lands everywhere at once. Nothing here
imports Ray or torch; ``aiohttp`` loads only inside the async poller.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

__all__ = ["ProcessExited", "await_ready", "free_port", "log_tail", "stop_process", "wait_ready"]


class ProcessExited(RuntimeError):
    """The process we were waiting for ended before it answered ready."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist), for start-up errors."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_ready(
    url: str,
    timeout_s: float = 300.0,
    *,
    path: str = "/readyz",
    exit_code: Callable[[], int | None] | None = None,
) -> None:
    """Poll ``GET url+path`` until 200 (blocking; for sync launchers).

    ``exit_code`` (e.g. ``Popen.poll``) stops the wait as soon as the process has ended:
    :class:`ProcessExited`. Otherwise :class:`TimeoutError` with the last answer.
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if exit_code is not None and (code := exit_code()) is not None:
            raise ProcessExited(f"exited with {code} before {url} was ready")
        try:
            with urllib.request.urlopen(f"{url}{path}", timeout=5) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last = f"{exc.code} {exc.read()[:300]!r}"
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.25)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f}s: {last}")


async def await_ready(
    url: str,
    timeout_s: float = 300.0,
    *,
    path: str = "/readyz",
    process: asyncio.subprocess.Process | None = None,
) -> None:
    """Poll ``GET url+path`` until 200 without blocking the event loop.

    Cancelling the caller stops the poll at once (no worker thread is left polling, which is
    what used to keep ``mnemo up`` alive for minutes after its sidecar died). When ``process``
    ends first: :class:`ProcessExited`.
    """
    import aiohttp

    deadline = time.monotonic() + timeout_s
    last = "no answer"
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline:
            if process is not None and process.returncode is not None:
                raise ProcessExited(f"exited with {process.returncode} before {url} was ready")
            try:
                async with session.get(f"{url}{path}") as response:
                    if response.status == 200:
                        return
                    last = f"{response.status} {(await response.read())[:300]!r}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.25)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f}s: {last}")


async def stop_process(process: asyncio.subprocess.Process, grace_s: float = 60.0) -> None:
    """SIGTERM ``process`` (when still running) and wait for it; SIGKILL after ``grace_s``."""
    if process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), grace_s)
    except TimeoutError:
        process.kill()
        await process.wait()
