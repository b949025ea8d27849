"""torch's thread count is per thread: the worker sets it where the model runs."""

import asyncio

import torch

from worker.service import in_thread


def test_threads_are_set_in_the_model_thread():
    """in_thread(n) sets torch's threads in the model's own thread, not only the loop's.

    Every model call runs there, the load and the warm-up included. A thread
    made while the process runs torch at 2 threads runs at 2 unless told:
    the control below, without which the check could not fail.
    """
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert asyncio.run(in_thread(None)(torch.get_num_threads)) == 2

        async def load_then_count(thread):
            await thread(lambda: (torch.ones(256, 256) @ torch.ones(256, 256)).sum())
            return await thread(torch.get_num_threads)

        assert asyncio.run(load_then_count(in_thread(1))) == 1
        assert asyncio.run(in_thread(None)(lambda: 41 + 1)) == 42
    finally:
        torch.set_num_threads(before)
