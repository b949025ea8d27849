"""The scheduler core imports only the standard library and ``schemas`` (and its
``Entry`` msgspec, for a record the cyclic collector does not track).

The core (``scheduler/{entry,cost,drr,lane,core,batch_order}.py``) runs unchanged in the
service, the simulator and the tests because it does no I/O and reads no
clock; an import of aiokafka, asyncio, prometheus_client, structlog or torch
would be the first step away from that. Two checks: every import statement
in the six files (read with ``ast``, so one inside a function counts too),
and the modules a fresh interpreter holds after importing the core.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ["entry", "cost", "drr", "lane", "core", "batch_order"]
#: What the core must never pull in, even through ``schemas``.
FORBIDDEN = {"aiokafka", "asyncio", "prometheus_client", "structlog", "torch",
             "sentence_transformers", "numpy", "kafka", "confluent_kafka"}


def imported(path: Path) -> set[str]:
    """Absolute names of every module an import statement in ``path`` names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import from {node.module!r}"
            names.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            raise AssertionError(f"{path.name}:{node.lineno}: __import__ hides an import")
    return names


#: What one core module may import beside those, and why: the held request's
#: record is a msgspec Struct the cyclic collector does not track (its docstring).
EXTRA = {"entry": {"msgspec"}}


def allowed(name: str, module: str = "") -> bool:
    top = name.split(".")[0]
    return (top in sys.stdlib_module_names or top == "schemas"
            or name in {f"scheduler.{m}" for m in CORE} or top in EXTRA.get(module, ()))


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_only_stdlib_schemas_and_the_core(module):
    """Every import in the core module is the standard library, schemas or another core module."""
    names = imported(ROOT / "scheduler" / f"{module}.py")
    bad = sorted(n for n in names if not allowed(n, module) or n.split(".")[0] in FORBIDDEN)
    assert not bad, f"scheduler/{module}.py imports {bad}"


def test_importing_the_core_loads_no_io_metrics_or_model_library():
    """A fresh interpreter that imports the core (and schemas under it) holds none of them."""
    code = ("import sys; import scheduler.core, scheduler.lane, scheduler.drr, scheduler.cost, "
            "scheduler.entry; print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    loaded = {name.split(".")[0] for name in out}
    assert not loaded & FORBIDDEN, sorted(loaded & FORBIDDEN)
    # Nothing of the services either: only the core's own modules of the package.
    assert {n for n in out if n.startswith("scheduler.")} <= {f"scheduler.{m}" for m in CORE}
