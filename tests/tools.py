"""External programs a test needs (``prometheus``, ``promtool``): skipped where missing,
except under CI (``CI=true``, set by CI services and by ``.ci/run``), where a missing one
fails the test: a check CI cannot run must not pass as a skip."""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = ["in_ci", "require_tool"]


def in_ci() -> bool:
    """``CI`` is ``true`` (or ``1``), as CI services and ``.ci/run`` set it."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1"}


def require_tool(name: str, why: str) -> str:
    """The path of program ``name``; where it is missing the test skips, or fails under CI."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not found: {why}"
        if in_ci():
            pytest.fail(f"{message} (CI=true: a missing tool fails the test, it does not skip)",
                        pytrace=False)
        pytest.skip(message)
    return path
