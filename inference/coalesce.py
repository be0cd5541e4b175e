"""Coalescing concurrent calls at the ingress: many small requests, one call to the model replica.

Every Serve call from the ingress to a model replica costs a Ray round trip (serialize, route, schedule,
deserialize) in both processes, whatever it carries. Under load, 1-item ``/embed`` requests paid that
once each, which capped the sidecar well below the model's own speed. :class:`CallCoalescer` merges the
calls that arrive while earlier ones are in flight into one call carrying all their arguments
("natural batching", as TEI's router does): an idle sidecar sends a lone request at once (no added
latency), a busy one sends one bundle per replica round trip.

The replica answers a bundle with one outcome per argument, a result or the exception for that argument
alone, so one caller's bad input (a text over the token limit) never fails its neighbours; an exception
raised by the call itself (the replica died, the queue is full) reaches every caller of the bundle.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["CallCoalescer"]

A = TypeVar("A")

# One bundle: (key, arguments) -> one outcome per argument (a result, or the exception to raise).
Send = Callable[[Hashable, list[A]], Awaitable[Sequence[Any]]]


@dataclasses.dataclass
class _Lane(Generic[A]):
    """The calls of one key: those waiting for a bundle and the number of bundles in flight."""

    waiting: list[tuple[A, asyncio.Future]] = dataclasses.field(default_factory=list)
    in_flight: int = 0


class CallCoalescer(Generic[A]):
    """Merges concurrent :meth:`call` s with the same key into bundles sent through ``send``.

    ``max_in_flight`` bundles per key run at once: two keep the replica busy (one computing while the
    next travels) without queueing more than a batch ahead. ``max_bundle`` bounds the arguments of
    one bundle (and so its message size); the rest wait for the next one.
    """

    def __init__(
        self,
        send: Send[A],
        *,
        max_in_flight: int = 2,
        max_bundle: int = 64,
        shared_failures: tuple[type[Exception], ...] = (),
    ) -> None:
        if max_in_flight < 1 or max_bundle < 1:
            raise ValueError("max_in_flight and max_bundle must be at least 1")
        self._send = send
        # A bundle failing with one of these fails the calls waiting behind it too: the failure is
        # the destination's (no replica to take them), so they would only wait to meet it again.
        self._shared_failures = shared_failures
        self.max_in_flight = max_in_flight
        self.max_bundle = max_bundle
        self._lanes: dict[Hashable, _Lane[A]] = {}
        self.bundles = 0  # bundles sent (monotonic): calls / bundles is the coalescing achieved
        self.calls = 0

    async def call(self, key: Hashable, argument: A) -> Any:
        """The outcome for ``argument``: its result, or raises its exception (or the bundle's)."""
        lane = self._lanes.setdefault(key, _Lane())
        future = asyncio.get_running_loop().create_future()
        lane.waiting.append((argument, future))
        self.calls += 1
        if lane.in_flight < self.max_in_flight:
            self._dispatch(key, lane)
        return await future  # a cancelled caller's future is skipped when the outcomes come back

    def _dispatch(self, key: Hashable, lane: _Lane[A]) -> None:
        bundle = [(arg, fut) for arg, fut in lane.waiting[: self.max_bundle] if not fut.done()]
        del lane.waiting[: self.max_bundle]
        if not bundle:
            return
        lane.in_flight += 1
        self.bundles += 1
        task = asyncio.get_running_loop().create_task(self._run(key, lane, bundle))
        task.add_done_callback(_consume)

    async def _run(self, key: Hashable, lane: _Lane[A], bundle: list[tuple[A, asyncio.Future]]) -> None:
        try:
            outcomes = await self._send(key, [arg for arg, _ in bundle])
            if len(outcomes) != len(bundle):
                raise RuntimeError(f"a bundle of {len(bundle)} calls got {len(outcomes)} outcomes")
        except asyncio.CancelledError:  # the ingress is shutting down: its callers go with it
            for _, future in bundle:
                future.cancel()
            raise
        except Exception as exc:  # the call itself failed: every caller of the bundle gets it
            failed = bundle
            if isinstance(exc, self._shared_failures):
                failed = bundle + lane.waiting
                lane.waiting = []
            for _, future in failed:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            lane.in_flight -= 1
            while lane.waiting and lane.in_flight < self.max_in_flight:
                self._dispatch(key, lane)
            if not lane.waiting and lane.in_flight == 0:
                self._lanes.pop(key, None)
        for (_, future), outcome in zip(bundle, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)


def _consume(task: asyncio.Task) -> None:
    """Bundles report through their callers' futures; a failed task's exception is already delivered."""
    if not task.cancelled():
        task.exception()
