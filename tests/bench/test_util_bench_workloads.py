"""The ray.util benchmark workloads run (smoke size) and return what the
runner reads; the figures themselves are the lead's, on a quiet machine."""
import pytest

from ray_lite.bench import _util_workloads as workloads


def test_b17_times_both_pools_in_the_same_trials():
    r = workloads.b17("smoke")
    assert r["n"] == 1000
    assert len(r["pool_ms"]) == len(r["stdlib_pool_ms"]) >= 1
    assert all(v > 0 for v in r["pool_ms"] + r["stdlib_pool_ms"])
    assert r["ratio"] > 0


def test_b18_measures_the_queue_per_item():
    r = workloads.b18("smoke")
    assert r["put_get_between_processes_us"] and r["put_then_get_driver_us"]
    assert all(v > 0 for v in r["put_get_between_processes_us"])


def test_actor_pool_map_throughput():
    r = workloads.actor_pool("smoke")
    assert r["items_per_s"] and all(v > 0 for v in r["items_per_s"])


def test_every_workload_is_registered():
    assert set(workloads.WORKLOADS) == {"b17", "b18", "actor_pool"}
    with pytest.raises(KeyError):
        workloads.pick("huge", 1, 2, 3)
