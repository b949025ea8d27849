"""The demo's CPU plan: each worker its own CPUs while one stays for the services."""

import pytest

from app import demo


@pytest.fixture
def cpus(monkeypatch):
    def set_cpus(n: int) -> None:
        monkeypatch.setattr(demo.os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)
    return set_cpus


def test_two_cpus_give_the_first_endpoints_worker_one_and_the_rest_share(cpus):
    """On 2 CPUs the first endpoint's worker gets one; everything else shares the other."""
    cpus(2)
    assert demo.plan_cpus(["embed", "rerank"], 1) == ({"worker-embed": {1}}, {0})


def test_enough_cpus_give_every_worker_its_own(cpus):
    """With enough CPUs each worker gets its own threads' worth, the rest go to the services."""
    cpus(16)
    pinned, services = demo.plan_cpus(["embed", "rerank"], 2)
    assert pinned == {"worker-embed": {14, 15}, "worker-rerank": {12, 13}}
    assert services == set(range(12))


def test_one_cpu_pins_nothing(cpus):
    """On one CPU nothing is pinned."""
    cpus(1)
    assert demo.plan_cpus(["embed"], 1) is None


def test_no_affinity_call_pins_nothing(monkeypatch):
    """Where the OS has no affinity call, nothing is pinned."""
    monkeypatch.delattr(demo.os, "sched_getaffinity", raising=False)
    assert demo.plan_cpus(["embed"], 1) is None
