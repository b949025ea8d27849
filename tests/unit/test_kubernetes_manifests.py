"""Static checks of deploy/kubernetes/: no cluster needed.

Every manifest validates against the Kubernetes schemas (kubernetes-validate
ships them, so this runs offline), and every name the manifests give the code
exists in it: each image is one the Dockerfiles build, each command is a
``serving-fairness`` subcommand whose flags parse, each ``SF_*`` variable is
one plumbing/settings.py generates from the role's settings class (or a Kafka
variable of plumbing/kafka.py), each port is the one the flags open, and the
configuration in the ConfigMap loads and has a worker for every endpoint.
"""

from __future__ import annotations

import argparse
import importlib
import tempfile
from functools import cache
from pathlib import Path, PurePosixPath

import kubernetes_validate
import pytest
import yaml

from app.cli import COMMANDS
from plumbing import kafka
from plumbing.service_settings import (
    AdmissionSettings,
    GatewaySettings,
    SchedulerSettings,
    WorkerSettings,
)
from plumbing.settings import describe
from schemas.config import load_config

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
ENTRY_POINT = "serving-fairness"
#: The oldest Kubernetes these manifests are meant for, and the newest the
#: installed kubernetes-validate knows.
VERSIONS = ("1.31", kubernetes_validate.latest_version())
#: Each role's settings class and the prefix of its variables (each service
#: module's ENV_PREFIX; checked below against the module).
ROLE_SETTINGS = {
    "admission": (AdmissionSettings, "SF_ADMISSION_"),
    "scheduler": (SchedulerSettings, "SF_SCHEDULER_"),
    "worker": (WorkerSettings, "SF_WORKER_"),
    "gateway": (GatewaySettings, "SF_GATEWAY_"),
}
#: The image each role runs: workers a torch image, the rest the slim one.
ROLE_IMAGES = {"worker": {"serving-fairness:cuda", "serving-fairness:cpu"}}
SLIM = "serving-fairness:slim"


# -- loading -------------------------------------------------------------------


@cache
def documents() -> tuple[dict, ...]:
    docs = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return tuple(docs)


def of_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in documents() if d["kind"] == kind}


def deployments() -> dict[str, dict]:
    return of_kind("Deployment")


def containers(deployment: dict) -> list[dict]:
    spec = deployment["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def main_container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def port_of(container: dict, name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert name in ports, f"{container['name']}: no port named {name!r}"
    return ports[name]


@cache
def config_map() -> dict:
    (config,) = of_kind("ConfigMap").values()
    return config


# -- schemas -------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_validate_against_the_kubernetes_schemas(version):
    """Each resource validates, unknown fields refused, against the oldest and newest version."""
    assert len(documents()) >= 8
    for doc in documents():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} on {version}: {e.message}")


def test_the_validator_refuses_an_unknown_field():
    """The check above is not vacuous: a misspelt field fails it."""
    doc = yaml.safe_load(yaml.safe_dump(deployments()["admission"]))
    main_container(doc)["readinesProbe"] = main_container(doc).pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)


def test_the_fleet_has_every_role():
    """Admission, two schedulers, the gateway with its Service, and a worker per endpoint."""
    assert {"admission", "scheduler", "gateway"} <= set(deployments())
    assert deployments()["scheduler"]["spec"]["replicas"] == 2
    roles = {main_container(d)["args"][0] for d in deployments().values()}
    assert roles == {"admission", "scheduler", "gateway", "worker"}
    assert "gateway" in of_kind("Service")


# -- names the manifests give the code ---------------------------------------------


def test_images_are_the_ones_the_dockerfiles_build():
    """Each container runs the image of its role, a tag that compose builds from docker/."""
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    built = {s["image"] for s in compose["services"].values()
             if "build" in s and str(s.get("image", "")).startswith(f"{ENTRY_POINT}:")}
    assert {SLIM, "serving-fairness:cpu", "serving-fairness:cuda"} <= built
    for name, deployment in deployments().items():
        for container in containers(deployment):
            image, role = container["image"], container["args"][0]
            assert image in built, f"{name}/{container['name']}: {image} is built nowhere"
            assert image in ROLE_IMAGES.get(role, {SLIM}), f"{name}: {role} on {image}"
            assert "command" not in container, "the image's entry point runs the subcommand"


def test_commands_are_subcommands_whose_flags_parse():
    """Each container's args are a serving-fairness subcommand its own parser accepts."""
    for name, deployment in deployments().items():
        for container in containers(deployment):
            args = container["args"]
            assert args[0] in COMMANDS, f"{name}: {args[0]!r} is not a subcommand"
            module = importlib.import_module(COMMANDS[args[0]][0])
            parser = argparse.ArgumentParser(prog=f"{ENTRY_POINT} {args[0]}", exit_on_error=False)
            module.add_arguments(parser)
            try:
                parser.parse_args(args[1:])
            except (argparse.ArgumentError, SystemExit) as e:
                pytest.fail(f"{name}/{container['name']}: `{' '.join(args)}` does not parse: {e}")


def test_role_prefixes_are_the_services_own():
    """ROLE_SETTINGS's prefixes are the ENV_PREFIX each service module reads its settings with."""
    for role, (_cls, prefix) in ROLE_SETTINGS.items():
        module = importlib.import_module(COMMANDS[role][0])
        assert module.ENV_PREFIX == prefix, role


def test_environment_variables_exist_in_the_code():
    """Every variable set is a Kafka variable or one of the role's settings' variables."""
    kafka_variables = {option.env for option in kafka._OPTIONS}
    assert "SF_BOOTSTRAP" in kafka_variables
    seen = set()
    for name, deployment in deployments().items():
        for container in containers(deployment):
            role = container["args"][0]
            cls, prefix = ROLE_SETTINGS.get(role, (None, None))
            own = {f"{prefix}{f.name.upper()}" for f in describe(cls)} if cls else set()
            for variable in container.get("env", []):
                seen.add(variable["name"])
                assert variable["name"] in kafka_variables | own, (
                    f"{name}/{container['name']}: {variable['name']} is read by no code of {role}")
            assert "SF_BOOTSTRAP" in {v["name"] for v in container.get("env", [])}, name
    assert "SF_GATEWAY_GATEWAY_ID" in seen


def test_ports_and_probes_are_the_ones_the_flags_open():
    """The metrics port is --metrics-port on 0.0.0.0 and what Prometheus is told; the gateway's
    http port is its --port on 0.0.0.0; probes ask the telemetry endpoint's own paths."""
    telemetry = (REPO / "plumbing" / "telemetry.py").read_text()
    for name, deployment in deployments().items():
        container = main_container(deployment)
        args = container["args"]
        metrics = port_of(container, "metrics")
        assert flag(args, "--metrics-port") == str(metrics), name
        assert flag(args, "--metrics-host") == "0.0.0.0", name
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", name
        assert annotations["prometheus.io/port"] == str(metrics), name
        assert annotations["prometheus.io/path"] == "/metrics", name
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container:
                get = container[probe]["httpGet"]
                assert get["port"] == "metrics", f"{name}: {probe}"
                assert get["path"] in ("/readyz", "/healthz"), f"{name}: {probe}"
                assert f'"{get["path"]}"' in telemetry, f"{get['path']} is served nowhere"
        assert "livenessProbe" in container and "readinessProbe" in container, name
    gateway = main_container(deployments()["gateway"])
    assert flag(gateway["args"], "--host") == "0.0.0.0"
    port = flag(gateway["args"], "--port") or str(GatewaySettings().port)
    assert port_of(gateway, "http") == int(port)


def test_admission_and_gateway_are_ready_on_readyz():
    for name in ("admission", "gateway"):
        probe = main_container(deployments()[name])["readinessProbe"]
        assert probe["httpGet"]["path"] == "/readyz", name


def test_gateway_service_reaches_the_gateway_pods():
    service = of_kind("Service")["gateway"]
    pod = deployments()["gateway"]["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    for port in service["spec"]["ports"]:
        port_of(main_container(deployments()["gateway"]), port["targetPort"])


def test_schedulers_are_leader_and_standby_under_a_disruption_budget():
    """Two scheduler replicas; a PDB over exactly their pods keeps one through a drain."""
    deployment = deployments()["scheduler"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (budget,) = of_kind("PodDisruptionBudget").values()
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    for name, other in deployments().items():
        if name != "scheduler":
            assert not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()
    assert budget["spec"]["minAvailable"] == 1
    # A standby answers 503 on /readyz by design; the budget counts ready pods.
    assert main_container(deployment)["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_workers_ask_for_a_gpu_each():
    workers = {n: d for n, d in deployments().items() if main_container(d)["args"][0] == "worker"}
    assert workers
    for name, deployment in workers.items():
        resources = main_container(deployment)["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == 1, name
        assert resources["limits"]["nvidia.com/gpu"] == 1, name
        assert main_container(deployment)["image"] == "serving-fairness:cuda", name


# -- the configuration -----------------------------------------------------------


def test_every_pod_reads_the_configmap_configuration():
    """--config is a key of the ConfigMap, mounted whole (so edits reach the pods) at its folder."""
    data = config_map()["data"]
    for name, deployment in deployments().items():
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        for container in containers(deployment):
            path = PurePosixPath(flag(container["args"], "--config"))
            mounts = [m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent)]
            assert len(mounts) == 1, f"{name}/{container['name']}: {path.parent} is not mounted"
            assert "subPath" not in mounts[0], "a subPath mount never sees an update"
            volume = volumes[mounts[0]["name"]]
            assert volume["configMap"]["name"] == config_map()["metadata"]["name"], name
            assert path.name in data, f"{name}: the ConfigMap has no {path.name}"


def test_the_configuration_loads_with_keys_and_a_worker_per_endpoint():
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.toml"
        path.write_text(config_map()["data"]["config.toml"])
        config = load_config(path)
    assert any(org.api_keys for org in config.orgs.values()), "no API key hash for the gateway"
    served = {flag(main_container(d)["args"], "--endpoint") for d in deployments().values()
              if main_container(d)["args"][0] == "worker"}
    assert set(config.endpoints) <= served
