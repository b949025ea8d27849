"""Worker efficiency: embedding tokens/s through the pipeline vs ``encode`` in one process.

Why: the pipeline puts Kafka hops, a scheduler and per-request results
around the model. With a real model the model should dominate: target, the
pipeline's tokens/s at least 0.85 of ``SentenceTransformer.encode`` on the
same texts in one process. Second target, measured by ``bench/batching.py``
(called here, not repeated): token-budget length-sorted micro-batches at
least 1.3x the tokens/s of fixed-size unsorted batches on mixed lengths.

- ``encode``: ``SentenceTransformer.encode(texts, batch_size=32)`` in this
  process (it sorts by length inside the call): the reference.
- ``pipeline``: the same texts, one per request from five orgs, sent at once
  through admission, the scheduler and one all-MiniLM-L6-v2 worker
  (:class:`app.stack.Stack`, in this process, sharing the *same* loaded
  model object); from the first send to the last result produced. The
  worker's own model time (the sum of its micro-batch times) is printed
  too, and the same model calls are then made again alone in this process
  (no Kafka, nothing else running) to split the gap into the batch shapes
  the pipeline gives the model and the pipeline around the model.

Tokens are real tokens, capped at the model's 256, the same count for both.
Texts of 8..256 tokens (uniform), made by ``bench/batching.py``'s
``make_texts``. Rounds interleave (encode, pipeline, encode...), the best of
each counts. Run: ``python bench/worker.py`` (256 texts, 2 rounds, then the
batching bench) or ``--quick`` (96 texts, batching ``--quick``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
_BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(_BENCH.parent))
sys.path.insert(0, str(_BENCH))

import batching  # bench/batching.py: texts of exact lengths, the micro-batching figures

from app.stack import Stack
from bench.figures import write_json
from plumbing.kafka import add_kafka_arguments, kafka_connected, settings_from_args
from plumbing.logs import configure_logging
from plumbing.topics import delete_topics, describe_topics
from schemas.build import build_config
from schemas.config import Config
from schemas.messages import EmbedInput, Request
from traffic.replay import ReplaySettings, replay
from traffic.replay_sources import ReplayItem

__all__ = ["main"]

ORGS = ("org-a", "org-b", "org-c", "org-d", "org-e")


def bench_config(prefix: str, model: str) -> Config:
    """One tier, the five orgs, and ``model`` on the embed endpoint.

    No rate limits and a latency target no burst here reaches: admission must
    let every request through, so the worker sees the whole load.
    """
    return build_config(prefix=prefix, worker_slots=2, tiers=["standard"],
                        endpoints={"embed": {"model": model, "quantum": 2048,
                                             "max_batch_tokens": 4096, "max_batch_size": 64,
                                             "max_request_tokens": 2048,
                                             "latency_target_ms": 3600000}},
                        orgs=dict.fromkeys(ORGS, "standard")).config


class _SharedModelStack(Stack):
    """A Stack whose worker uses a model already loaded here (no second copy)."""

    def __init__(self, *args, model_object=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._model_object = model_object

    async def _models(self):
        return {"embed": self._model_object}


def _timed(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def _encode_calls(encode, calls: list[tuple[list[str], list[int]]]) -> None:
    for texts, lengths in calls:
        encode(texts, lengths=lengths)


async def pipeline_round(kafka, config: Config, texts: list[str]) -> tuple[float, float]:
    """Seconds from the first send to the last result, and the worker's model seconds."""
    items = [ReplayItem(ts=0.0, tokens=0, request=Request(
        id=f"t{i}", org=ORGS[i % len(ORGS)], endpoint="embed", input=EmbedInput(texts=(t,))))
        for i, t in enumerate(texts)]
    run = await replay(kafka, config, items, ReplaySettings(
        timeout_s=600, progress=False, samples=False, lead_s=0.05))
    bad = [o for o in run.outcomes if o.status != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} requests not ok, e.g. {bad[0]}")
    start = min(o.arrival_s for o in run.outcomes)
    end = max(o.completed_s for o in run.outcomes)
    return end - start, run.stats.get("model_s", 0.0)


async def amain(args: argparse.Namespace) -> dict:
    from worker.models import SentenceTransformerEmbedder

    n = args.texts or (96 if args.quick else 256)
    t0 = time.perf_counter()
    embedder = SentenceTransformerEmbedder(batching.MODEL, device=args.device)
    load_s = time.perf_counter() - t0  # torch + sentence-transformers import included
    texts, lengths = batching.make_texts(embedder, n, args.min_tokens, args.max_tokens,
                                         args.seed)
    real = sum(min(k, embedder.max_seq_length) for k in lengths)
    # encode() sorts all texts by length, then cuts batches of batch_size.
    by_len = sorted((min(k, embedder.max_seq_length) for k in lengths), reverse=True)
    encode_padded = sum(len(by_len[i:i + args.batch_size]) * by_len[i]
                        for i in range(0, n, args.batch_size))
    embedder.encode(texts[:4])  # warm-up

    limit = embedder.max_seq_length
    model_seconds: list[float] = []
    padded: list[int] = []
    calls: list[tuple[list[str], list[int]]] = []  # the worker's model calls, as made
    original_encode = embedder.encode

    def timed_encode(batch, *, lengths=None):
        start = time.perf_counter()
        try:
            return original_encode(batch, lengths=lengths)
        finally:
            model_seconds.append(time.perf_counter() - start)
            ks = lengths if lengths is not None else embedder.token_lengths(batch)
            padded.append(len(ks) * min(max(ks), limit))
            calls.append((list(batch), list(ks)))

    kafka = settings_from_args(args)
    encode_s: list[float] = []
    pipe_s: list[float] = []
    model_s: list[float] = []
    worker_padded: list[int] = []
    alone_s: list[float] = []
    async with kafka_connected(kafka) as kafka:
        prefix = f"benchw{uuid.uuid4().hex[:6]}."
        config = bench_config(prefix, batching.MODEL)
        try:
            async with _SharedModelStack(config, kafka, endpoints=["embed"],
                                         model_object=embedder):
                for _ in range(args.repeat):
                    # In a thread: the services' heartbeats must go on meanwhile.
                    encode_s.append(await asyncio.to_thread(
                        _timed, embedder.model.encode, texts, batch_size=args.batch_size,
                        show_progress_bar=False))
                    model_seconds.clear()
                    padded.clear()
                    calls.clear()
                    embedder.encode = timed_encode
                    try:
                        seconds, _ = await pipeline_round(kafka, config, texts)
                    finally:
                        embedder.encode = original_encode
                    pipe_s.append(seconds)
                    model_s.append(sum(model_seconds))
                    worker_padded.append(sum(padded))
                    # The same model calls again, alone in this process: the batch
                    # shapes' cost without the pipeline around them.
                    alone_s.append(await asyncio.to_thread(
                        _timed, _encode_calls, original_encode, list(calls)))
        finally:
            await delete_topics(kafka, await describe_topics(kafka, prefix))
    enc_tps = real / min(encode_s)
    pipe_tps = real / min(pipe_s)
    best = pipe_s.index(min(pipe_s))
    model_tps = real / model_s[best]
    ratio = pipe_tps / enc_tps
    print(f"model {batching.MODEL} on {embedder.device} (import + load {load_s:.1f} s); {n} texts of "
          f"{args.min_tokens}..{args.max_tokens} tokens, {real:,} real tokens; one text per "
          f"request, 5 orgs; best of {args.repeat} interleaved rounds")
    print(f"{'':<46}{'seconds':>9}{'tokens/s':>10}")
    print(f"{'SentenceTransformer.encode, one process':<46}{min(encode_s):>9.2f}{enc_tps:>10,.0f}")
    print(f"{'pipeline end to end (MiniLM worker)':<46}{min(pipe_s):>9.2f}{pipe_tps:>10,.0f}")
    print(f"{'  of which the worker model busy':<46}{model_s[best]:>9.2f}{model_tps:>10,.0f}")
    print(f"{'the worker model calls again, alone':<46}{min(alone_s):>9.2f}"
          f"{real / min(alone_s):>10,.0f}")
    print(f"padding (padded / real tokens): encode {encode_padded / real:.2f}x, worker "
          f"{worker_padded[best] / real:.2f}x ({len(model_seconds)} model calls)")
    shape = (real / min(alone_s)) / enc_tps
    print(f"split of the ratio: batch shapes (calls alone / encode) {shape:.2f} x pipeline "
          f"around them (pipeline / calls alone) {ratio / shape:.2f}")
    print(f"ratio pipeline / encode: {ratio:.2f} (target >= 0.85: "
          f"{'met' if ratio >= 0.85 else 'NOT met'}); rounds encode "
          f"{', '.join(f'{x:.2f}' for x in encode_s)} s, pipeline "
          f"{', '.join(f'{x:.2f}' for x in pipe_s)} s")
    return {"texts": n, "real_tokens": real, "encode_s": encode_s, "pipeline_s": pipe_s,
            "model_s": model_s, "encode_tps": enc_tps, "pipeline_tps": pipe_tps,
            "model_tps": model_tps, "ratio": ratio, "encode_padding": encode_padded / real,
            "alone_s": alone_s, "alone_tps": real / min(alone_s), "shape_ratio": shape,
            "worker_padding": worker_padded[best] / real}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="96 texts; batching --quick")
    parser.add_argument("--texts", type=int, default=None, help="default 256, quick 96")
    parser.add_argument("--min-tokens", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32, help="encode() batch size")
    parser.add_argument("--repeat", type=int, default=2, help="rounds; the best one counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    parser.add_argument("--skip-batching", action="store_true",
                        help="do not run bench/batching.py afterwards")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    add_kafka_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging("WARNING")  # the services log every batch at INFO
    figures = asyncio.run(amain(args))
    if not args.skip_batching:
        print("\n## token-budget sorted vs fixed-size unsorted batches (bench/batching.py)\n")
        figures["batching"] = batching.main(["--quick"] if args.quick else [])
    write_json(args.json, figures)
    return figures


if __name__ == "__main__":
    main()
