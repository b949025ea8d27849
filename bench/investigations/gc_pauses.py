"""Collector pauses per process, from the files ``bench/investigations/gcwatch`` left.

Run a command with the watch on, then print what each process paused for:

    mkdir -p out/gc && SF_GCWATCH_DIR=out/gc PYTHONPATH=bench/investigations/gcwatch \\
        serving-fairness demo --skip-x5
    python bench/investigations/gc_pauses.py out/gc

One row per process: its command, then per generation the collections, their
total and their longest, split into those before the process froze its
start-up heap (``plumbing.heap.settle``: start-up, the model's load) and
those after (serving). Durations are wall-clock: on a busy machine a
collection's time includes waiting for a CPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _name(argv: list[str]) -> str:
    """The program and its first word (``cli.py scheduler``); ``-c`` for an inline one."""
    words = [a for a in argv if not a.startswith("-")]
    return " ".join(Path(w).name for w in words[:2]) or "-c"


def summary(pauses: list[list], frozen: bool) -> str:
    cells = []
    for gen in (0, 1, 2):
        ms = [p[1] * 1000 for p in pauses if p[0] == gen and bool(p[2]) == frozen]
        cells.append(f"{len(ms):>5} {sum(ms):>8.0f} {max(ms, default=0):>7.1f}")
    return "  ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", help="the SF_GCWATCH_DIR the processes wrote to")
    args = parser.parse_args()
    rows = [json.loads(p.read_text()) for p in sorted(Path(args.dir).glob("gc.*.json"))]
    head = "  ".join(f"{'gen' + str(g) + ' n':>5} {'sum ms':>8} {'max ms':>7}" for g in (0, 1, 2))
    print(f"{'process':<28} {'when':<10} {head}")
    for row in rows:
        for frozen, when in ((False, "start-up"), (True, "serving")):
            if any(bool(p[2]) == frozen for p in row["pauses"]):
                print(f"{_name(row['argv']):<28} {when:<10} {summary(row['pauses'], frozen)}")


if __name__ == "__main__":
    main()
