"""A service's Prometheus metrics, read once over HTTP: what a bench takes from a
running pipeline beside its results (model time, calls made)."""

from __future__ import annotations

import urllib.request

__all__ = ["scrape"]


def scrape(port: int) -> dict[str, float]:
    """A service's /metrics as {'name{labels}': value} (bounded by a 5 s timeout)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out
