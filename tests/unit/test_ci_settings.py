"""CI runs the hypothesis profile the documentation says it runs."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import settings

ROOT = Path(__file__).resolve().parents[2]


def test_ci_exports_the_derandomized_profile_docs_trust_names():
    """.ci/run sets SF_HYPOTHESIS_PROFILE=ci, a registered, derandomized profile, as trust.md says."""
    exported = re.findall(r"^export SF_HYPOTHESIS_PROFILE=(\w+)$", (ROOT / ".ci/run").read_text(),
                          re.MULTILINE)
    assert exported == ["ci"], exported
    assert settings.get_profile("ci").derandomize
    trust = (ROOT / "docs/trust.md").read_text()
    assert "SF_HYPOTHESIS_PROFILE=ci python -m pytest tests/fuzz          # as in CI" in trust
    assert "CI (`.ci/run`) sets `SF_HYPOTHESIS_PROFILE=ci`" in trust
