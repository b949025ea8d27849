"""Print the requirements of the base install plus the named extras, one a line.

The images install the dependencies in a layer of their own, keyed on
pyproject.toml and requirements.lock alone, before the code is copied in (so a
code change rebuilds in seconds); pip cannot read an extra's requirements from
pyproject.toml without the project, so this does:

    python docker/requirements.py worker model > /tmp/requirements.txt
    pip install --constraint requirements.lock --requirement /tmp/requirements.txt

An extra that names the project's own extras (``all``) is expanded.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    own = re.compile(rf"^{re.escape(project['name'])}\[([^\]]+)\]$")
    found = list(project["dependencies"])
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"no extra {extra!r} in {pyproject}; known: {', '.join(optional)}")
        seen.add(extra)
        for requirement in optional[extra]:
            if match := own.match(requirement.replace(" ", "")):
                todo.extend(match.group(1).split(","))
            elif requirement not in found:
                found.append(requirement)
    return found


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    pyproject = next(p for p in (Path("pyproject.toml"), here.parent / "pyproject.toml")
                     if p.is_file())
    print("\n".join(requirements(pyproject, sys.argv[1:])))
