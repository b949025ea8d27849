"""Texts made up to a token count, for replaying traffic logs that carry none.

A production traffic log usually records how many tokens a request had, not
its texts (privacy, size). To replay it through the live pipeline the replay
needs inputs that *cost the same*: admission counts the tokens of what it
receives with the endpoint's tokenizer, and that count drives the rate
limits, the throttle and the DRR cost. So texts are built from words the
tokenizer keeps whole (one token each) and then checked with the same
:class:`~tokens.counting.TokenCounter` admission uses, adding or removing
words until the count matches. For WordPiece (MiniLM) and the fake models'
whitespace counter the first guess is exact; other tokenizers converge in a
step or two, or end within a token or two of the target.

Deterministic: the words come from a ``random.Random`` seeded with the
request's id, so a replay sends the same texts on every run and machine.

Shapes, per endpoint kind:

* ``embed``: ``ceil(tokens / max_text_tokens)`` texts (the model's
  ``max_seq_length``, so nothing is truncated), the tokens split evenly;
* ``rerank``: a short query and ``ceil(tokens / max_text_tokens)``
  documents; the count is that of admission, the query read once per
  document (``count_pairs``).

A target below what one one-word text costs (``[CLS] w [SEP]`` is 3 tokens
on MiniLM) cannot be met; the text then costs that minimum.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from schemas.messages import EmbedInput, Input, RerankInput
from tokens.counting import TokenCounter

__all__ = ["COMMON_WORDS", "SynthError", "TextSynth"]

#: Common English words. Those the tokenizer counts as one token are used
#: (here, and by ``bench/batching.py`` for texts of exact token counts).
COMMON_WORDS = (  # noqa: SIM905 - a word list reads better as one string
    "the of and to in is was for on that with as by at from his her an it they this be are "
    "which or had not but have one all were their there been if more when who will no out so "
    "up can what about into than them only other new some could time these two may then do "
    "first any my now such like our over man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people "
    "how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old year off "
    "come since against go came right used take three house water light small large number "
    "city country school family group problem service market system program question night "
    "point home story money month right study book word business issue side kind head far "
    "black white red green blue river music power hour game line end member law car team "
    "minute idea body information back parent face others level office door health person "
    "art war history party result change morning reason research girl guy early food before "
    "moment air teacher force education foot boy age policy process music market sense nation "
    "plan college interest death experience effect class control care field development role "
    "effort rate heart drug show leader light voice wife police mind price report decision"
).split()

#: Words tried before giving up on a tokenizer (keeps the list small but varied).
_MIN_WORDS = 16
#: Search steps after the first guess (a bisection of 4,096 words needs 12).
_FIT_ROUNDS = 12


class SynthError(ValueError):
    """The tokenizer keeps too few common English words whole to build texts."""


class TextSynth:
    """Builds inputs of a given token count as ``counter`` counts them.

    ``max_text_tokens`` caps one text (default: the counter's
    ``max_seq_length``, else 256); ``max_texts`` caps texts per request
    (the endpoint's ``max_texts``): a request over both gets longer texts.
    """

    def __init__(self, counter: TokenCounter, *, max_text_tokens: int | None = None,
                 max_texts: int = 64):
        self.counter = counter
        self.max_text_tokens = max(1, max_text_tokens or counter.max_seq_length or 256)
        self.max_texts = max(1, max_texts)
        #: Tokens of an empty text: the special tokens ([CLS], [SEP]).
        self.base = counter.count([""])[0]
        #: Tokens of an empty (query, document) pair.
        self.pair_base = counter.count_pairs("", [""])[0]
        words = sorted(set(COMMON_WORDS))
        counts = counter.count(words)
        self.words = [w for w, n in zip(words, counts, strict=True) if n == self.base + 1]
        if len(self.words) < _MIN_WORDS:
            raise SynthError(
                f"tokenizer {counter.name!r} keeps only {len(self.words)} common English words "
                f"as one token (needs {_MIN_WORDS}); give the trace texts instead"
            )

    # -- public ------------------------------------------------------------

    def embed(self, tokens: int, seed: str) -> list[str]:
        """Texts whose token counts add up to ``tokens`` (or the least possible)."""
        n = min(self.max_texts, max(1, math.ceil(tokens / self.max_text_tokens)))
        targets = _split(tokens, n)
        seqs = [_Words(self.words, f"embed:{seed}:{i}") for i in range(n)]
        texts = [seq.text(max(1, t - self.base)) for seq, t in zip(seqs, targets, strict=True)]
        counts = self.counter.count(texts)
        for i, (t, c) in enumerate(zip(targets, counts, strict=True)):
            if c != t:  # not additive over words: search this text's length
                texts[i] = _fit(seqs[i], lambda x: self.counter.count([x])[0], t,
                                max(1, t - self.base), c)
        return texts

    def rerank(self, tokens: int, seed: str) -> tuple[str, list[str]]:
        """A query and documents whose pair counts add up to ``tokens``."""
        n = min(self.max_texts, max(1, math.ceil(tokens / self.max_text_tokens)))
        # A query of about a quarter of a pair, 1..16 words.
        q = max(1, min(16, (tokens // n - self.pair_base) // 4))
        while n > 1 and tokens - n * (self.pair_base + q) < n:
            n -= 1
        if tokens - n * (self.pair_base + q) < n:
            q = 1
        query = _Words(self.words, f"query:{seed}").text(q)
        rest = tokens - n * (self.pair_base + q)
        seqs = [_Words(self.words, f"doc:{seed}:{i}") for i in range(n)]
        docs = [seq.text(max(1, k)) for seq, k in zip(seqs, _split(rest, n), strict=True)]
        total = sum(self.counter.count_pairs(query, docs))
        if total != tokens:
            # Not additive: search the last document's length on the total.
            others = sum(self.counter.count_pairs(query, docs[:-1])) if n > 1 else 0
            last = total - others
            docs[-1] = _fit(seqs[-1], lambda x: self.counter.count_pairs(query, [x])[0],
                            tokens - others, len(docs[-1].split()), last)
        return query, docs

    def make_input(self, kind: str, tokens: int, seed: str) -> Input:
        """An :class:`EmbedInput` or :class:`RerankInput` of ``tokens`` tokens."""
        if kind == "rerank":
            query, docs = self.rerank(tokens, seed)
            return RerankInput(query=query, documents=tuple(docs))
        return EmbedInput(texts=tuple(self.embed(tokens, seed)))

    def count(self, inp: Input) -> int:
        """Tokens of ``inp`` as admission counts them (at least 1)."""
        if isinstance(inp, RerankInput):
            return max(1, sum(self.counter.count_pairs(inp.query, inp.documents)))
        return max(1, sum(self.counter.count(inp.texts)))


class _Words:
    """One text's deterministic word sequence; ``text(k)`` is its first ``k`` words.

    Every length of a text is a prefix of the same sequence, so its token
    count grows with ``k`` and a search over ``k`` is well behaved.
    """

    def __init__(self, words: Sequence[str], seed: str):
        self._rng = random.Random(seed)
        self._pool = words
        self._seq: list[str] = []

    def text(self, k: int) -> str:
        if k > len(self._seq):
            self._seq += self._rng.choices(self._pool, k=k - len(self._seq))
        return " ".join(self._seq[:k])


def _fit(seq: _Words, measure: Callable[[str], int], target: int, k: int, count: int) -> str:
    """The prefix of ``seq`` whose ``measure`` is closest to ``target`` (starting at ``k``)."""
    lo, hi = 1, None
    text = seq.text(k)
    best = (abs(count - target), text)
    for _ in range(_FIT_ROUNDS):
        if count == target:
            break
        if count < target:
            lo = k + 1
        else:
            hi = k - 1
        if hi is not None and lo > hi:
            break
        # Scale by the tokens per word seen so far, then stay inside the bracket.
        guess = round(k * target / count) if count > 0 else k + 1
        if guess == k:
            guess = k + (1 if count < target else -1)
        k = max(lo, guess if hi is None else min(hi, guess))
        text = seq.text(k)
        count = measure(text)
        best = min(best, (abs(count - target), text))
    return best[1]


def _split(total: int, n: int) -> Sequence[int]:
    """``total`` in ``n`` near-equal integer parts (the first ones larger)."""
    q, r = divmod(max(0, total), n)
    return [q + (1 if i < r else 0) for i in range(n)]
