"""How an expected, retried fault is logged: one WARNING line with what failed, why, which retry comes
next and when. ERROR (with its traceback) is kept for what needs a person: a database restarting
under the drain, a sidecar outage or a lost listening connection are retried by the code itself, and
an operator reading ERROR lines for them would learn to ignore ERROR."""

from __future__ import annotations

import logging

__all__ = ["log_retry"]


def log_retry(log: logging.Logger, what: str, cause: object, retry: int, delay_s: float) -> None:
    """``what`` failed with ``cause``; retry number ``retry`` (1 for the first) comes in ``delay_s``."""
    log.warning("%s: %s; retry %d in %.1fs", what, cause, retry, delay_s)
