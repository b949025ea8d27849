"""``serving-fairness keys``: make an API key, or hash one you hold.

``keys new --org X`` prints a fresh key once (it is stored nowhere) and the
line to add to ``[orgs.X]``; with ``--config C`` it checks that the org
exists. ``keys hash`` reads a key on standard input and prints its hash,
to find which line to remove when revoking it. A running gateway takes a
new or removed line on SIGHUP (or when the file changes).
"""

from __future__ import annotations

import argparse
import sys

from gateway.keys import hash_key, new_key
from schemas.config import ConfigError, load_config

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    new = sub.add_parser("new", help="make a key for an org: the key once, and its hash")
    new.add_argument("--org", required=True, help="the org the key proves")
    new.add_argument("--config", default=None,
                     help="check that the org is in this configuration")
    sub.add_parser("hash", help="print the hash of a key read on standard input")


def run(args: argparse.Namespace) -> int:
    if args.action == "hash":
        key = sys.stdin.readline().strip()
        if not key:
            print("serving-fairness keys hash: no key on standard input", file=sys.stderr)
            return 2
        print(hash_key(key))
        return 0
    if args.config is not None:
        try:
            config = load_config(args.config)
        except ConfigError as e:
            print(f"serving-fairness keys: {e}", file=sys.stderr)
            return 2
        if args.org not in config.orgs:
            print(f"serving-fairness keys: org {args.org!r} is not in {args.config} "
                  f"(orgs: {', '.join(sorted(config.orgs))})", file=sys.stderr)
            return 2
    key = new_key()
    print(f"key (shown once, store it now): {key}")
    print(f"add to [orgs.{args.org}] in the configuration, then reload (SIGHUP):")
    print(f'api_keys = ["{hash_key(key)}"]')
    return 0
