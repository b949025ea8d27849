"""What a bench does with its figures once its arguments are parsed.

Most benches run one coroutine over their arguments with the services'
logging turned down (they log every batch at INFO), then write what it
returned as JSON where ``--json`` names a file. :func:`run_quietly` is that;
:func:`write_json` is the last step alone, for the benches that run
otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from plumbing.logs import configure_logging

__all__ = ["run_quietly", "write_json"]


def write_json(path: str | Path | None, figures: dict) -> None:
    """Write ``figures`` to ``path`` as indented JSON (None: nowhere); values JSON
    cannot hold are written as their ``str``."""
    if path:
        Path(path).write_text(json.dumps(figures, indent=2, default=str))


def run_quietly(amain: Callable[[argparse.Namespace], Coroutine[Any, Any, dict]],
                args: argparse.Namespace) -> dict:
    """``amain(args)`` with warnings only in the log; its figures also to ``args.json``."""
    configure_logging("WARNING")
    figures = asyncio.run(amain(args))
    write_json(args.json, figures)
    return figures
