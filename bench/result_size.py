"""Result size: 384-value float vectors as JSON numbers, JSON base64 and msgpack binary.

Why: an embedding result's vectors are most of its bytes. As JSON numbers a
384-value vector is ~8 KB of text, which every hop after the worker carries
and the client parses; packed (``encoding: "base64"``) it is 1,536 bytes,
base64 text in JSON, a binary in msgpack. This bench shows, side by side in
one run, what each costs:

- **bytes** of one result, as the worker encodes it (``codec_for(Result)``),
  and of its vectors alone (the result's bytes less those of the same result
  without vectors);
- **codec time**: the worker's encode plus the client's decode to a numpy
  array (:func:`schemas.vectors.decode_embeddings`), per result, in this
  process (best of 5 runs of 2,000);
- **end to end**: N requests of one 16-word text each (``--texts K``: K texts,
  so K vectors per result), sent at once through
  the live pipeline (admission, scheduler, one worker: :class:`app.stack.Stack`
  in this process) by one :class:`producer.client.FairnessClient`; time from
  the first send to the last result received *and decoded to numpy*. The
  model is the fake at 384 values and 0 ms (``--model`` to change), so what
  is measured is the pipeline and the result's encoding, not a model.

Variants: ``json numbers`` (JSON request, default encoding), ``json base64``
(JSON request, ``encoding: "base64"``), ``msgpack binary`` (msgpack request,
``encoding: "base64"``: the result is msgpack with the bytes as a binary),
and ``msgpack numbers`` for reference. Rounds interleave the variants; each
variant's best round counts.

Run: ``python bench/result_size.py`` (N = 2,000, 3 rounds), ``--quick``
(N = 500, 2 rounds), ``--json OUT`` also writes the figures.
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
import numpy as np

from app.stack import Stack
from bench.figures import run_quietly
from plumbing.kafka import add_kafka_arguments, kafka_connected, settings_from_args
from plumbing.topics import delete_topics, describe_topics
from producer.client import FairnessClient
from schemas.build import build_config
from schemas.codec import codec_for
from schemas.config import Config
from schemas.messages import Result
from schemas.vectors import decode_embeddings, result_fields

__all__ = ["VARIANTS", "main"]

ROOT = Path(__file__).resolve().parent.parent
#: name -> (request wire format, embedding encoding)
VARIANTS: dict[str, tuple[str, str]] = {
    "json numbers": ("json", "float"),
    "json base64": ("json", "base64"),
    "msgpack binary": ("msgpack", "base64"),
    "msgpack numbers": ("msgpack", "float"),
}
_results = codec_for(Result)
_WORDS = ["fair", "scheduling", "keeps", "every", "tenant's", "requests", "moving", "while",
          "one", "org", "bursts", "thousands", "of", "embedding", "calls", "into", "the",
          "shared", "queue"]


def bench_config(prefix: str) -> Config:
    """The shipped example configuration under ``prefix``."""
    return build_config(base=(ROOT / "examples" / "config.toml").read_text(), prefix=prefix).config


def one_result(vectors: np.ndarray, encoding: str) -> Result:
    n = len(vectors)
    return Result(id="r" * 32, status="ok", org="acme", endpoint="embed", model="fake:dim=384",
                  truncated=[False] * n, tokens=18 * n, batch_id="b" * 32, worker="w" * 24,
                  created_ms=1_700_000_000_000, admitted_ms=1_700_000_000_001,
                  dispatched_ms=1_700_000_000_002, completed_ms=1_700_000_000_003,
                  inference_ms=1.25, dimensions=vectors.shape[1],
                  **result_fields({"float": vectors}, encoding))


def sizes_and_codec(dim: int, texts: int, reps: int = 2_000) -> dict[str, dict[str, float]]:
    """Bytes of one result and of its vectors, and encode + decode-to-numpy microseconds."""
    vector = np.random.default_rng(0).standard_normal((texts, dim)).astype(np.float32)
    vector /= np.linalg.norm(vector, axis=1, keepdims=True)
    bare = one_result(vector, "float")
    bare = msgspec.structs.replace(bare, embeddings=None)
    reps = max(20, reps // texts)
    out = {}
    for name, (fmt, encoding) in VARIANTS.items():
        result = one_result(vector, encoding)
        data = _results.encode(result, fmt)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                decode_embeddings(_results.decode(_results.encode(result, fmt), fmt))
            best = min(best, (time.perf_counter() - t0) / reps)
        assert np.array_equal(decode_embeddings(_results.decode(data, fmt))["float"], vector)
        out[name] = {"result_bytes": len(data),
                     "vector_bytes": len(data) - len(_results.encode(bare, fmt)),
                     "codec_us": best * 1e6}
    return out


async def pipeline_round(client: FairnessClient, n: int, texts: int, encoding: str,
                         tag: str) -> float:
    """Seconds from the first send to the last result received and decoded; all must be ok."""
    inputs = [{"type": "embed", "texts": [" ".join(_WORDS[(i + j + k) % len(_WORDS)]
                                                   for k in range(16)) for j in range(texts)]}
              for i in range(n)]
    if encoding != "float":
        for inp in inputs:
            inp["encoding"] = encoding
    t0 = time.perf_counter()
    ids = await asyncio.gather(*(client.submit({"id": f"{tag}-{i}", "org": "acme",
                                                "endpoint": "embed", "input": inp})
                                 for i, inp in enumerate(inputs)))
    results = await asyncio.gather(*(client.result(rid, timeout=300) for rid in ids))
    for r in results:
        if r.status != "ok":
            raise RuntimeError(f"request {r.id} not ok: {r.reason}: {r.message}")
        decode_embeddings(r)
    return time.perf_counter() - t0


async def amain(args: argparse.Namespace) -> dict:
    n = args.requests or (500 if args.quick else 2_000)
    repeat = args.repeat or (2 if args.quick else 3)
    dim = 384
    sizes = sizes_and_codec(dim, args.texts)
    kafka = settings_from_args(args)
    embedded = kafka.bootstrap is None
    rounds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    async with kafka_connected(kafka) as kafka:
        prefix = f"bench{uuid.uuid4().hex[:6]}."
        config = bench_config(prefix)
        try:
            async with Stack(config, kafka, model=args.model, endpoints=["embed"]):
                clients = {fmt: FairnessClient(kafka, config, wire_format=fmt)
                           for fmt in ("json", "msgpack")}
                for c in clients.values():
                    await c.start()
                try:
                    for fmt, encoding in VARIANTS.values():  # warm-up
                        await pipeline_round(clients[fmt], 100, args.texts, encoding,
                                             f"w-{uuid.uuid4().hex[:6]}")
                    for k in range(repeat):
                        for name, (fmt, encoding) in VARIANTS.items():
                            rounds[name].append(await pipeline_round(
                                clients[fmt], n, args.texts, encoding,
                                f"{k}-{uuid.uuid4().hex[:6]}"))
                finally:
                    for c in clients.values():
                        await c.stop()
        finally:
            await delete_topics(kafka, await describe_topics(kafka, prefix))
    print(f"{dim}-value float vectors, {args.texts} per result; model {args.model}; {n:,} requests "
          f"through the pipeline per round, best of {repeat} interleaved rounds; broker "
          f"{'embedded Tansu' if embedded else kafka.bootstrap}")
    print(f"{'':<18}{'result B':>10}{'vectors B':>10}{'codec us':>10}{'e2e req/s':>11}"
          f"{'rounds (s)':>22}")
    figures: dict = {"dimensions": dim, "texts_per_request": args.texts, "requests": n,
                     "rounds": repeat, "model": args.model, "variants": {}}
    for name in VARIANTS:
        rps = n / min(rounds[name])
        s = sizes[name]
        print(f"{name:<18}{s['result_bytes']:>10,}{s['vector_bytes']:>10,}{s['codec_us']:>10.1f}"
              f"{rps:>11,.0f}{', '.join(f'{x:.2f}' for x in rounds[name]):>22}")
        figures["variants"][name] = {**s, "e2e_rps": rps, "rounds_s": rounds[name]}
    return figures


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="500 requests, 2 rounds")
    parser.add_argument("--requests", type=int, default=None, help="per round (default 2,000)")
    parser.add_argument("--repeat", type=int, default=None, help="rounds (default 3, quick 2)")
    parser.add_argument("--texts", type=int, default=1,
                        help="texts per request, so vectors per result (default 1)")
    parser.add_argument("--model", default="fake:dim=384",
                        help="model spec of the worker (default fake:dim=384, 0 ms)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    add_kafka_arguments(parser)
    args = parser.parse_args(argv)
    return run_quietly(amain, args)


if __name__ == "__main__":
    main()
