"""A test that needs a missing program skips, except under CI=true, where it fails."""

from __future__ import annotations

import pytest

from tests.tools import in_ci, require_tool

_NOWHERE = "sf-no-such-program-anywhere"


def test_a_missing_program_skips_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    assert not in_ci()
    with pytest.raises(pytest.skip.Exception, match=_NOWHERE):
        require_tool(_NOWHERE, "why it is needed")


@pytest.mark.parametrize("value", ["true", "TRUE", "1"])
def test_a_missing_program_fails_under_ci(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    assert in_ci()
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_tool(_NOWHERE, "why it is needed")


def test_a_program_that_is_there_is_found(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert require_tool("sh", "a shell").endswith("sh")
