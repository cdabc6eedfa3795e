"""The batcher of ``serve`` on its own event loop: batch limits, waiting, the bound."""

from __future__ import annotations

import asyncio
import random

import pytest

from paralela.serving._serve_batcher import Batcher, QueueFull


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_a_full_batch_goes_at_once_and_the_rest_waits_for_the_next() -> None:
    async def main() -> tuple[list[int], list[int], float]:
        batcher = Batcher(max_batch=3, max_wait=10.0, max_queue=100)
        batcher.put([1, 2, 3, 4])
        loop = asyncio.get_running_loop()
        started = loop.time()
        first = [i.value for i in await batcher.take()]
        took = loop.time() - started
        batcher.put([5, 6])
        second = [i.value for i in await batcher.take()]
        return first, second, took

    first, second, took = run(main())  # type: ignore[misc]
    assert first == [1, 2, 3]
    assert second == [4, 5, 6]
    assert took < 1.0, "a full batch waited for max_wait"


def test_a_batch_that_does_not_fill_goes_after_max_wait_from_its_first_input() -> None:
    async def main() -> tuple[list[int], float]:
        batcher = Batcher(max_batch=8, max_wait=0.2, max_queue=100)
        loop = asyncio.get_running_loop()
        started = loop.time()
        batcher.put([1])
        loop.call_later(0.1, batcher.put, [2])
        batch = await batcher.take()
        return [i.value for i in batch], loop.time() - started

    values, waited = run(main())  # type: ignore[misc]
    assert values == [1, 2]
    assert 0.18 <= waited < 0.6


def test_max_wait_zero_takes_what_is_there() -> None:
    async def main() -> list[int]:
        batcher = Batcher(max_batch=8, max_wait=0.0, max_queue=100)
        batcher.put([1, 2])
        return [i.value for i in await batcher.take()]

    assert run(main()) == [1, 2]


def test_a_taker_waits_for_the_first_input() -> None:
    async def main() -> list[int]:
        batcher = Batcher(max_batch=2, max_wait=0.0, max_queue=100)
        taking = asyncio.ensure_future(batcher.take())
        await asyncio.sleep(0.05)
        assert not taking.done()
        batcher.put(["x"])
        return [i.value for i in await taking]

    assert run(main()) == ["x"]


def test_the_queue_is_bounded_and_refuses_whole_requests() -> None:
    async def main() -> int:
        batcher = Batcher(max_batch=2, max_wait=0.0, max_queue=3)
        batcher.put([1, 2])
        with pytest.raises(QueueFull):
            batcher.put([3, 4])  # would hold 4: nothing of it is queued
        batcher.put([3])
        return len(batcher)

    assert run(main()) == 3


def test_inputs_of_requests_that_left_are_dropped_and_free_the_queue() -> None:
    async def main() -> list[int]:
        batcher = Batcher(max_batch=4, max_wait=0.0, max_queue=3)
        gone = batcher.put([1, 2])
        batcher.put([3])
        for future in gone:
            future.cancel()  # the request timed out or its client left
        batcher.put([4, 5])  # fits once the abandoned inputs are dropped
        return [i.value for i in await batcher.take()]

    assert run(main()) == [3, 4, 5]


def test_fail_all_fails_every_waiting_input() -> None:
    async def main() -> list[str]:
        batcher = Batcher(max_batch=4, max_wait=0.0, max_queue=10)
        futures = batcher.put([1, 2])
        batcher.fail_all(RuntimeError("stopping"))
        return [str(f.exception()) for f in futures]

    assert run(main()) == ["stopping", "stopping"]


def test_free_workers_share_the_queue() -> None:
    async def main() -> list[int]:
        batcher = Batcher(max_batch=32, max_wait=0.0, max_queue=100)
        takers = [asyncio.ensure_future(batcher.take()) for _ in range(2)]
        await asyncio.sleep(0.01)  # both workers are free and waiting
        batcher.put(list(range(8)))
        return sorted(len(b) for b in await asyncio.gather(*takers))

    assert run(main()) == [4, 4]


def test_a_lone_free_worker_takes_the_whole_queue() -> None:
    async def main() -> int:
        batcher = Batcher(max_batch=32, max_wait=0.0, max_queue=100)
        batcher.put(list(range(8)))
        return len(await batcher.take())

    assert run(main()) == 8


def _took(batcher: Batcher, expect: int, linger: float) -> asyncio.Future[list[int]]:
    async def take() -> list[int]:
        return [i.value for i in await batcher.take(expect, linger)]

    return asyncio.ensure_future(asyncio.wait_for(take(), 30.0))  # hang-proof


def test_a_worker_that_answered_a_batch_waits_for_its_clients_to_come_back() -> None:
    async def main() -> list[int]:
        # 8 closed-loop clients: 4 queued while the worker answered the other 4
        batcher = Batcher(max_batch=32, max_wait=0.0, max_queue=100)
        batcher.put([1, 2, 3, 4])
        taking = _took(batcher, expect=4, linger=60.0)
        loop = asyncio.get_running_loop()
        for i, value in enumerate([5, 6, 7, 8]):
            loop.call_later(0.01 * (i + 1), batcher.put, [value])
        return await taking  # not after 60 s: the 4th client ends the wait

    assert run(main()) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_the_linger_ends_at_its_bound_when_the_clients_do_not_come_back() -> None:
    async def main() -> list[int]:
        batcher = Batcher(max_batch=32, max_wait=0.0, max_queue=100)
        batcher.put([1, 2])
        return await _took(batcher, expect=4, linger=0.05)

    assert run(main()) == [1, 2]


def test_a_lone_client_is_answered_without_a_wait() -> None:
    async def main() -> list[str]:
        # c=1: the worker answered one input and expects one: its client's next request
        batcher = Batcher(max_batch=32, max_wait=0.0, max_queue=100)
        taking = _took(batcher, expect=1, linger=60.0)
        await asyncio.sleep(0.01)
        batcher.put(["next"])
        return await taking

    assert run(main()) == ["next"]


def test_no_linger_when_the_queue_already_fills_a_batch() -> None:
    async def main() -> list[int]:
        batcher = Batcher(max_batch=4, max_wait=0.0, max_queue=100)
        batcher.put([1, 2, 3, 4, 5])
        return await _took(batcher, expect=4, linger=60.0)

    assert run(main()) == [1, 2, 3, 4]


def test_a_lingering_worker_counts_inputs_another_free_worker_took() -> None:
    async def main() -> tuple[list[int], list[int]]:
        batcher = Batcher(max_batch=32, max_wait=0.0, max_queue=100)
        idle = _took(batcher, expect=0, linger=0.0)  # free, expecting nobody: takes at once
        await asyncio.sleep(0.01)
        lingering = _took(batcher, expect=2, linger=60.0)
        await asyncio.sleep(0.01)
        batcher.put([1])  # the idle worker takes it; the lingering one still counts it
        first = await idle
        batcher.put([2])
        return first, await lingering

    assert run(main()) == ([1], [2])


def test_with_two_workers_a_batch_is_at_most_a_fair_share() -> None:
    """The split of the clients the load began with does not stick: a worker whose 25
    clients come back while the other holds 7 takes 16 and leaves 9 for the other."""

    async def main() -> tuple[int, int, int, int]:
        batcher = Batcher(max_batch=32, max_wait=0.0, max_queue=100, workers=1)
        batcher.put(list(range(7)))
        held = await batcher.take()  # the other worker's, taken alone, not yet released
        batcher.workers = 2  # this one is serving too (the pool keeps the count)
        taking = _took(batcher, expect=25, linger=60.0)  # this one answered 25
        await asyncio.sleep(0.01)
        batcher.put(list(range(100, 125)))  # its 25 clients come back
        mine = await taking
        left = len(batcher)
        batcher.release(len(held))
        batcher.release(len(mine))
        return len(held), len(mine), left, len(await batcher.take(expect=7, linger=0.0))

    # then, both released, 9 queued and 7 clients expected back: a share of 16 is 8
    assert run(main()) == (7, 16, 9, 8)


def test_unbalanced_clients_even_out_between_two_workers() -> None:
    """Closed-loop clients on two simulated workers (a batch costs 4 ms + 6.5 ms an
    input, as the benchmark's model on one CPU): 8 clients, then 24 more at once.
    Without the fair share the first worker to come free took the newcomers and kept
    them (batches of 6-10 on one worker beside 21-26 on the other, in every run)."""
    rng = random.Random(7)

    async def main() -> list[float]:
        batcher = Batcher(max_batch=32, max_wait=0.0, max_queue=1000, workers=2)
        sizes: list[list[int]] = [[], []]
        stop = False

        async def worker(i: int) -> None:
            answered, took = 0, 0.0
            loop = asyncio.get_running_loop()
            while not stop:
                batch = await batcher.take(answered, 0.25 * took)
                started = loop.time()
                await asyncio.sleep((0.004 + 0.0065 * len(batch)) * rng.uniform(0.9, 1.1))
                took, answered = loop.time() - started, len(batch)
                batcher.release(len(batch))
                sizes[i].append(len(batch))
                for item in batch:
                    item.future.set_result(None)

        async def client() -> None:
            while not stop:
                await batcher.put([0])[0]
                await asyncio.sleep(rng.uniform(0.0005, 0.002))

        tasks = [asyncio.ensure_future(worker(i)) for i in range(2)]
        tasks += [asyncio.ensure_future(client()) for _ in range(8)]
        await asyncio.sleep(0.4)
        tasks += [asyncio.ensure_future(client()) for _ in range(24)]
        await asyncio.sleep(0.6)
        counts = [len(s) for s in sizes]
        await asyncio.sleep(1.2)
        stop = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return [sum(s[n:]) / max(1, len(s) - n) for s, n in zip(sizes, counts, strict=True)]

    means = run(main())
    assert all(means), means
    assert max(means) / min(means) < 1.5, f"mean batch sizes of the two workers: {means}"


def test_with_two_workers_a_burst_after_a_quiet_spell_still_fills_shares() -> None:
    """Both workers wait on an empty queue (a share of nothing as they began); a burst
    of 32 gives each a share of the burst, not one input each."""

    async def main() -> list[int]:
        batcher = Batcher(max_batch=32, max_wait=0.0, max_queue=100, workers=2)
        takers = [_took(batcher, expect=0, linger=0.0) for _ in range(2)]
        await asyncio.sleep(0.01)
        batcher.put(list(range(32)))
        return sorted(len(batch) for batch in await asyncio.gather(*takers))

    assert run(main()) == [16, 16]
