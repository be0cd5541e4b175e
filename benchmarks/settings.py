"""What the benchmarks take from the environment: the processes a benchmark starts (a gateway, a
peer server, a child of its own) inherit this process's environment plus explicit overrides. The
stack's settings come through the services' own settings classes."""

from __future__ import annotations

import os

__all__ = ["child_environment"]


def child_environment(**overrides: str) -> dict[str, str]:
    """The environment for a subprocess: this process's, with ``overrides`` on top."""
    return {**os.environ, **overrides}
