"""Dynamic batching for ``paralela serve``: one bounded queue of inputs, and batches taken
from it by whichever model worker is free.

::

    request {"inputs": [a, b]} ──put──> [a][b][c][d]...   (at most max_queue; more: QueueFull)
                                          │ take(): a free worker waits until max_batch
                                          │ inputs are queued or the first has waited
                                          │ max_wait, whichever comes first
                                          ▼
                                 worker 0: [a b c d]   worker 1: [e f]

Each input carries its own future: the answer goes to the request that asked for it, in
its order. An input whose request is gone (timed out, client left) has a done future and
is dropped when taken. Under load the workers are busy while inputs queue, so batches grow
with no waiting at all; ``max_wait`` only trades latency for larger batches at light load.
All of it runs on the server's event loop: no locks.

A worker that has just answered ``k`` inputs expects their clients back: clients send
their next request once answered. Taking at once what else is queued would split the
clients into groups that take turns (8 clients: two alternating batches of 4, each paying
the model's fixed cost per batch); so the worker lingers, at most ``linger`` seconds, until
``k`` more inputs have arrived. A lone client is answered with no wait (its next request
is all the worker expects), and nothing lingers when no batch just ended.

With several workers, a batch is at most a fair share of the inputs in the server: those
queued, those the other workers hold, and the ones this worker expects back, over the
workers. Lingering alone would keep whatever split of the clients the load began with: on
2 CPUs with 2 workers, 32 clients that came on top of 8 stayed split 7 / 25 between the
workers (batches of 7 every 55 ms beside batches of 25 every 170 ms) until the server
stopped; the cap brings them to 16 / 16 within a few batches.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

__all__ = ["Batcher", "Item", "QueueFull"]

_NO_CAP = 1 << 62


class QueueFull(Exception):
    """The queue holds ``max_queue`` inputs: the server answers 503 with Retry-After."""


class Item:
    """One input waiting for its answer."""

    __slots__ = ("enqueued", "future", "value")

    def __init__(self, value: Any, future: asyncio.Future[Any], enqueued: float) -> None:
        self.value = value
        self.future = future
        self.enqueued = enqueued


class Batcher:
    """A bounded queue of inputs that model workers take batches from.

    Args:
        max_batch: the most inputs in one batch.
        max_wait: seconds a batch of fewer than ``max_batch`` inputs waits for more,
            counted from the arrival of its first input (0: take what is there).
        max_queue: the most inputs waiting; :meth:`put` raises :class:`QueueFull` beyond.
        workers: the workers taking batches (each reports its batch's end with
            :meth:`release`); with more than one, a batch is at most a fair share.
    """

    def __init__(self, max_batch: int, max_wait: float, max_queue: int, workers: int = 1) -> None:
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.max_queue = max_queue
        self.workers = workers
        self._held = 0  # inputs taken and not yet released: in the other workers' hands
        self._items: collections.deque[Item] = collections.deque()
        self._waiters: list[asyncio.Future[None]] = []  # takers waiting for an input
        self._filling: list[asyncio.Future[None]] = []  # takers waiting for a full batch
        self._takers = 0  # workers inside take(): free, waiting for a batch
        self._arrived = 0  # inputs ever queued: a lingering worker counts its clients back

    def __len__(self) -> int:
        return len(self._items)

    def put(self, values: list[Any]) -> list[asyncio.Future[Any]]:
        """Queue ``values``; a future per value, resolved with its output.

        Raises:
            QueueFull: they do not fit in the queue (none is queued then).
        """
        if len(self._items) + len(values) > self.max_queue:
            self._drop_abandoned()
            if len(self._items) + len(values) > self.max_queue:
                raise QueueFull
        loop = asyncio.get_running_loop()
        now = loop.time()
        futures = []
        for value in values:
            future: asyncio.Future[Any] = loop.create_future()
            self._items.append(Item(value, future, now))
            futures.append(future)
        self._arrived += len(values)
        _wake(self._waiters)
        _wake(self._filling)  # each checks its own target: few, and only while lingering
        return futures

    async def take(self, expect: int = 0, linger: float = 0.0) -> list[Item]:
        """The next batch: between 1 and ``max_batch`` inputs whose requests still wait.
        When several workers are free, each takes its share of the queue (8 inputs and 2
        free workers: 4 each), so that none idles while another runs a double batch.

        Args:
            expect: inputs the worker has just answered, whose clients are expected back.
            linger: the most seconds to wait for them: until ``expect`` more inputs have
                arrived (fewer when the queue would pass ``max_batch``).
        """
        self._takers += 1
        try:
            cap = self._fair_share(expect)
            need = min(expect, self.max_batch - len(self._items), cap - len(self._items))
            if need > 0 and linger > 0:
                await self._linger(self._arrived + need, linger)
            batch = await self._take(cap)
            self._held += len(batch)
            return batch
        finally:
            self._takers -= 1

    def _fair_share(self, expect: int) -> int:
        """The most inputs a batch may take (module doc): any with one worker."""
        if self.workers <= 1:
            return _NO_CAP
        return max(1, -(-(self._held + len(self._items) + expect) // self.workers))

    def release(self, n: int) -> None:
        """A worker is done with a batch of ``n`` inputs (answered, failed or abandoned)."""
        self._held = max(0, self._held - n)

    async def _linger(self, target: int, linger: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + linger
        while self._arrived < target:
            delay = deadline - loop.time()
            if delay <= 0:
                return
            await _wait(loop, self._filling, delay)

    async def _take(self, cap: int) -> list[Item]:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_abandoned()
            if not self._items:
                await _wait(loop, self._waiters, None)
                continue
            if len(self._items) < self.max_batch and self.max_wait > 0:
                delay = self._items[0].enqueued + self.max_wait - loop.time()
                if delay > 0:
                    await _wait(loop, self._filling, delay)
                    continue
            share = -(-len(self._items) // self._takers)  # ceil: this taker's part
            # the share as the take began (clients expected back), or as it is now (a
            # burst that came while this worker waited for its first input)
            limit = min(self.max_batch, share, max(cap, self._fair_share(0)))
            batch: list[Item] = []
            while self._items and len(batch) < limit:
                item = self._items.popleft()
                if not item.future.done():
                    batch.append(item)
            if batch:
                return batch

    def fail_all(self, exc: BaseException) -> None:
        """Fail every queued input with ``exc`` (the server is stopping)."""
        while self._items:
            item = self._items.popleft()
            if not item.future.done():
                item.future.set_exception(exc)

    def _drop_abandoned(self) -> None:
        while self._items and self._items[0].future.done():
            self._items.popleft()
        if len(self._items) >= self.max_queue:  # abandoned ones in the middle, too
            self._items = collections.deque(i for i in self._items if not i.future.done())


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
    waiters.clear()


async def _wait(
    loop: asyncio.AbstractEventLoop, waiters: list[asyncio.Future[None]], delay: float | None
) -> None:
    waiter: asyncio.Future[None] = loop.create_future()
    waiters.append(waiter)
    timer = None
    if delay is not None:
        timer = loop.call_later(delay, _wake, [waiter])
    try:
        await waiter
    finally:
        if timer is not None:
            timer.cancel()
        if waiter in waiters:
            waiters.remove(waiter)
