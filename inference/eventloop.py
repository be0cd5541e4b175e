"""The event loop Mnemo's services run on: uvloop when installed, unless ``RAG_UVLOOP`` says otherwise.

uvloop (libuv under asyncio's API) is the loop fast Python web services reach for first: issue 15's
profile put 42% of the gateway's own CPU in the event loop and its socket writes. One setting for
every process, so a suspected loop bug is ruled in or out by one environment variable:

- ``RAG_UVLOOP=auto`` (default): uvloop when it is importable, asyncio's own loop otherwise;
- ``on``: uvloop, and a loud start-up error naming the package when it is missing;
- ``off``: asyncio's own loop.

The gateway, ``mnemo mcp``, ``mnemo drain`` and the other ``mnemo`` commands of ``index`` run their
``main`` through :func:`run`. The sidecar's HTTP front lives in a Ray worker, whose loop Ray picks
at the worker's start (uvloop when importable, unless ``RAY_USE_UVLOOP=0``):
:func:`ray_environment` gives the variable that carries this setting there.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from .settings import LoopSettings, SettingsError, load_settings

__all__ = [
    "UVLOOP_ENV",
    "LoopSettingError",
    "command",
    "loop_factory",
    "loop_name",
    "ray_environment",
    "run",
    "use_uvloop",
]

UVLOOP_ENV = "RAG_UVLOOP"  # declared in inference.settings.LoopSettings

T = TypeVar("T")


class LoopSettingError(ValueError):
    """``RAG_UVLOOP`` holds an unknown value, or asks for uvloop where it is not installed."""


def use_uvloop(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``RAG_UVLOOP`` (in ``environ``, default the process's) selects uvloop here."""
    try:
        choice = load_settings(LoopSettings, environ).choice
    except SettingsError as exc:
        raise LoopSettingError(str(exc)) from exc
    installed = importlib.util.find_spec("uvloop") is not None
    if choice == "on" and not installed:
        raise LoopSettingError(
            f"{UVLOOP_ENV}=on but the uvloop package is not installed (pip install uvloop)"
        )
    return choice != "off" and installed


def loop_factory(environ: Mapping[str, str] | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """``asyncio.Runner``'s ``loop_factory`` for the setting: ``uvloop.new_event_loop``, or ``None``
    (asyncio's default loop)."""
    if not use_uvloop(environ):
        return None
    import uvloop  # optional at import time: "auto" works where it is absent

    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], *, environ: Mapping[str, str] | None = None) -> T:
    """``asyncio.run(main)`` on the loop ``RAG_UVLOOP`` selects."""
    try:
        factory = loop_factory(environ)
    except LoopSettingError:
        main.close()  # never awaited: close it so no "coroutine was never awaited" warning hides the error
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def command(main: Callable[[Any], Coroutine[Any, Any, int | None]], prog: str) -> Callable[[Any], int | None]:
    """An argparse handler that runs ``main(args)`` through :func:`run`; a bad ``RAG_UVLOOP`` is a
    start-up error on stderr, prefixed with ``prog`` (exit status 2, like the other settings)."""

    def handler(args: Any) -> int | None:
        try:
            return run(main(args))
        except LoopSettingError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2

    return handler


def loop_name(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """``uvloop`` or ``asyncio``: which loop runs (the running one by default), for logs and tests."""
    loop = loop or asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def ray_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``RAY_USE_UVLOOP`` for the Ray processes a sidecar starts, from ``RAG_UVLOOP``: Ray installs
    uvloop in its workers when importable unless that variable is false."""
    return {"RAY_USE_UVLOOP": "1" if use_uvloop(environ) else "0"}
