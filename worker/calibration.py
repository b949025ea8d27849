"""The calibration set of int8/uint8 embeddings, and the ranges cached per option.

:mod:`worker.quantize` explains why a service needs fixed ranges. They come
from embedding :data:`CALIBRATION_TEXTS` (64 short English texts: questions
and passages from many subjects, the mix a general embedding endpoint sees)
with the request's prompt, ``normalize`` and ``dimensions``. A deployment
whose traffic looks different (another language, code, long documents)
gets better int8 vectors from a sample of its own traffic: pass
``calibration_texts`` to :class:`worker.execute.BatchExecutor`.

Each distinct (prompt, normalize, dimensions) is calibrated once per worker,
on first use (one model call over the set, ~0.1-0.3 s on a CPU for
MiniLM), and kept in a bounded cache. Workers on the same kind of device
compute the same ranges; a CPU and a GPU worker may differ in the last bits
of a range, so a value at a bucket's edge can land one bucket apart.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from worker.quantize import ranges_of

__all__ = ["CALIBRATION_TEXTS", "RangeCache"]

CALIBRATION_TEXTS: tuple[str, ...] = (
    "How do I reset my password?",
    "What is the capital of Australia?",
    "best hiking trails near the coast",
    "symptoms of vitamin D deficiency",
    "how to cook rice without a rice cooker",
    "Why is the sky blue?",
    "cheap flights from Paris to Tokyo in March",
    "what does a database index do",
    "Who wrote Pride and Prejudice?",
    "convert 5 miles to kilometres",
    "python list comprehension with condition",
    "how long does it take to learn the piano",
    "When did the Berlin Wall fall?",
    "mortgage rates for first time buyers",
    "difference between a virus and a bacterium",
    "how to change a flat tyre",
    "Is coffee bad for your heart?",
    "remote jobs for data analysts",
    "what time zone is Chicago in",
    "how many moons does Jupiter have",
    "recipe for vegetable soup",
    "How does a heat pump work in winter?",
    "translate good morning into Spanish",
    "what is the return policy for online orders",
    "The Great Barrier Reef is the largest coral reef system in the world.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The company reported a ten percent rise in quarterly revenue.",
    "Regular exercise lowers the risk of heart disease and improves sleep.",
    "The train to the airport leaves every fifteen minutes from platform four.",
    "Kafka partitions keep the records of one key in order.",
    "Our support team answers emails within one business day.",
    "The museum is closed on Mondays and public holidays.",
    "A balanced diet includes vegetables, whole grains and lean protein.",
    "The river flooded after three days of heavy rain.",
    "Mix the flour and butter, then add the eggs one at a time.",
    "The contract may be cancelled with thirty days written notice.",
    "Solar panels produce less power on cloudy days.",
    "The striker scored twice in the second half to win the match.",
    "Interest rates were left unchanged at the central bank meeting.",
    "The new phone has a larger battery and a brighter screen.",
    "Children learn languages faster when they hear them every day.",
    "The hotel offers free breakfast and parking for guests.",
    "Antibiotics do not work against viral infections such as the flu.",
    "The library lends e-books to members for up to three weeks.",
    "Volcanic eruptions can cool the climate for a year or two.",
    "Please restart the router if the connection keeps dropping.",
    "The novel follows a family across three generations in a small town.",
    "Wind turbines turn the kinetic energy of air into electricity.",
    "Shares fell sharply after the merger was called off.",
    "The recipe serves four and takes about forty minutes.",
    "Bees pollinate a large share of the crops people eat.",
    "The software update fixes a bug that drained the battery.",
    "Tickets for the concert sold out within an hour.",
    "The treaty was signed by twelve countries in 1957.",
    "Drink plenty of water and rest if you have a fever.",
    "The app lets you split bills with friends and track shared costs.",
    "The glacier has retreated two kilometres since 1950.",
    "Customers can track their parcel with the number in the email.",
    "The court ruled that the law was unconstitutional.",
    "A good night's sleep improves memory and concentration.",
    "The bakery on the corner sells fresh bread every morning.",
    "Electric cars are cheaper to run but cost more to buy.",
    "The team shipped the new search feature after two months of testing.",
    "Owls hunt at night and can turn their heads almost all the way round.",
)


class RangeCache:
    """int8/uint8 ranges per option key, computed once each and kept (bounded, LRU).

    ``embed(texts, key)`` computes the calibration embeddings for ``key``;
    :meth:`get` returns the (2, dim) ranges. Mutated only by :meth:`get`.
    """

    def __init__(self, texts: Sequence[str] = CALIBRATION_TEXTS, *, max_keys: int = 1024):
        if not texts:
            raise ValueError("the calibration set needs at least one text")
        self.texts = list(texts)
        self.max_keys = max_keys
        self._ranges: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        #: Calibrations computed so far (for tests and metrics).
        self.computed = 0

    def cached(self, key: Hashable) -> np.ndarray | None:
        ranges = self._ranges.get(key)
        if ranges is not None:
            self._ranges.move_to_end(key)
        return ranges

    def get(self, key: Hashable, embed: Callable[[list[str], Hashable], np.ndarray]) -> np.ndarray:
        """The ranges for ``key``, computing them with ``embed`` when not cached."""
        ranges = self.cached(key)
        if ranges is None:
            ranges = ranges_of(embed(self.texts, key))
            self.computed += 1
            self._ranges[key] = ranges
            while len(self._ranges) > self.max_keys:
                self._ranges.popitem(last=False)
        return ranges
