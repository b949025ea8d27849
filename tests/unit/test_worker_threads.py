"""torch's thread count is per thread: the worker sets it where the model runs."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import torch

from worker.service import in_thread


def test_threads_are_set_in_the_pool_thread_that_runs_the_model():
    """in_thread(n) sets torch's threads in the pool thread that runs the call, not only the loop's."""
    before = torch.get_num_threads()
    loop = asyncio.new_event_loop()
    try:
        with ThreadPoolExecutor(1) as pool:
            # The pool thread ran torch first (it loaded the model) at 2 threads...
            def load():
                torch.set_num_threads(2)
                return (torch.ones(256, 256) @ torch.ones(256, 256)).sum()
            pool.submit(load).result()
            # ...and setting 1 in the event loop's thread does not reach it.
            torch.set_num_threads(1)
            assert pool.submit(torch.get_num_threads).result() == 2
            loop.set_default_executor(pool)
            assert loop.run_until_complete(in_thread(1)(torch.get_num_threads)) == 1
            assert loop.run_until_complete(in_thread(None)(lambda: 41 + 1)) == 42
    finally:
        loop.close()
        torch.set_num_threads(before)
