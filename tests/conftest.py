"""Shared test configuration: hypothesis profiles and the repository on ``sys.path``.

Hypothesis profiles (pick one with ``--hypothesis-profile NAME`` or the
environment variable ``SF_HYPOTHESIS_PROFILE``; the command-line option wins):

* ``dev`` (default): 200 examples per property, no per-example deadline (a
  shared two-core CI box makes timings noisy), ``too_slow`` suppressed.
* ``ci``: the same, derandomized, so a CI run is reproducible. ``.ci/run``
  sets it (``tests/unit/test_ci_settings.py`` keeps that and
  ``docs/trust.md`` in step).
* ``long``: 5,000 examples per property, for a soak run before a release.

Tests that are heavier per example scale their ``max_examples`` from the
loaded profile (see ``tests/property``), so ``long`` deepens every property.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

# ``pytest`` (unlike ``python -m pytest``) does not put the repository root on
# sys.path; test modules import shared test code as ``tests.<module>``.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("dev", max_examples=200, **_COMMON)
settings.register_profile("ci", max_examples=200, derandomize=True, **_COMMON)
settings.register_profile("long", max_examples=5_000, **_COMMON)
settings.load_profile(os.environ.get("SF_HYPOTHESIS_PROFILE", "dev"))
