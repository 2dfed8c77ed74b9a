"""``ray_lite.util.metrics``: Ray's Counter, Gauge and Histogram, checked as
Ray checks them, usable from the driver, tasks, actors and Serve replicas,
and served under Ray's exported names while Serve exports metrics."""
import importlib.util
import os
import pickle
import warnings

import pytest

import ray_lite
from ray_lite.util import metrics

needs_prometheus = pytest.mark.skipif(importlib.util.find_spec("prometheus_client") is None,
                                      reason="prometheus_client is not installed")


@pytest.mark.parametrize("make, error, words", [
    (lambda: metrics.Counter(""), ValueError, "Empty name"),
    (lambda: metrics.Counter(7), TypeError, "name must be a str"),
    (lambda: metrics.Counter("c", tag_keys=["a"]), TypeError, "tuple"),
    (lambda: metrics.Gauge("g", tag_keys=("a", 1)), TypeError, "Tag keys must be str"),
    (lambda: metrics.Histogram("h"), ValueError, "boundaries argument should be provided"),
    (lambda: metrics.Histogram("h", boundaries=[]), ValueError, "boundaries argument"),
    (lambda: metrics.Histogram("h", boundaries=[1, 0]), ValueError, "index 1"),
    (lambda: metrics.Histogram("h", boundaries=[1, "2"]), TypeError, "index 1"),
    (lambda: metrics.Counter("c").inc(0), ValueError, "value must be >0, got 0"),
    (lambda: metrics.Counter("c").inc(-2.5), ValueError, "got -2.5"),
    (lambda: metrics.Counter("c").inc("1"), TypeError, "int or float"),
    (lambda: metrics.Gauge("g").set("1"), TypeError, "int or float"),
    (lambda: metrics.Histogram("h", boundaries=[1]).observe(None), TypeError, "int or float"),
    (lambda: metrics.Counter("c", tag_keys=("a", "b")).inc(tags={"a": "x"}), ValueError,
     "Missing value for tag key(s): b."),
    (lambda: metrics.Counter("c", tag_keys=("a",)).inc(tags={"a": 1}), TypeError,
     "Tag values must be str"),
    (lambda: metrics.Gauge("g", tag_keys=("a",)).set_default_tags({"b": "x"}), ValueError,
     "Unrecognized tag key b."),
    (lambda: metrics.Gauge("g", tag_keys=("a",)).set_default_tags({"a": 2}), TypeError,
     "Tag values must be str"),
])
def test_arguments_are_checked_as_ray_checks_them(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert words in str(info.value)


def test_default_tags_info_and_what_a_pickle_keeps():
    c = metrics.Counter("requests", "Requests served.", tag_keys=("route", "code"))
    assert c.set_default_tags({"route": "/a"}) is c
    c.inc(tags={"code": "200"})         # the default fills the other key
    c.inc(3, tags={"route": "/b", "code": "500"})
    assert c.info == {"name": "requests", "description": "Requests served.",
                      "tag_keys": ("route", "code"), "default_tags": {"route": "/a"}}
    h = metrics.Histogram("latency_ms", boundaries=[10, 1, 100])
    assert h.info["boundaries"] == [10, 1, 100]
    # Rebuilt from name, description, tag keys (and boundaries), as Ray's:
    # default tags stay behind.
    again = pickle.loads(pickle.dumps(c))
    assert type(again) is metrics.Counter
    assert again.info == {**c.info, "default_tags": {}}
    assert pickle.loads(pickle.dumps(h)).info == h.info
    metrics.Gauge("temperature").set(None)      # Ray's no-op


def test_a_name_prometheus_cannot_take_warns_and_records_nothing():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = metrics.Gauge("9lives", tag_keys=("a",))
        metrics.Histogram("bad-name", boundaries=[1])
    assert [str(w.message).split(".")[0] for w in caught] == [
        "Invalid metric name: 9lives", "Invalid metric name: bad-name"]
    assert all(w.filename == __file__ for w in caught)      # the user's line
    g.set(1)        # discarded, even without its tag value (as Ray's)


@ray_lite.remote
def count_in_a_task(counter, n):
    for _ in range(n):
        counter.inc(tags={"where": "task"})
    return n


@ray_lite.remote
class Thermometer:
    def __init__(self):
        self.gauge = metrics.Gauge("thermometer_celsius", tag_keys=("room",))

    def read(self, value):
        self.gauge.set(value, tags={"room": "lab"})
        return value


def test_tasks_and_actors_record_without_an_export(rt):
    counter = metrics.Counter("work_done", tag_keys=("where",))
    counter.inc(tags={"where": "driver"})
    assert ray_lite.get(count_in_a_task.remote(counter, 3), timeout=60) == 3
    t = Thermometer.remote()
    assert ray_lite.get(t.read.remote(21.5), timeout=60) == 21.5
    # A bad record in a worker is the caller's error, with Ray's words.
    with pytest.raises(ray_lite.exceptions.RayTaskError, match="Missing value for tag key"):
        ray_lite.get(count_in_a_task.remote(metrics.Counter("c2", tag_keys=("x",)), 1),
                     timeout=60)


# -------------------------------------------------- exported through Serve
@needs_prometheus
def test_serve_exports_what_replicas_tasks_and_the_driver_record(serve_runtime):
    from starlette.requests import Request

    from ray_lite import serve
    from ray_lite.serve.api import _http_port

    from serve_helpers import free_port, http, metric_value, scrape_metrics

    @serve.deployment(num_replicas=2)
    class Model:
        def __init__(self, made_in_the_driver):
            self.requests = made_in_the_driver
            self.latency = metrics.Histogram("model_latency_ms", "Handler time.",
                                             boundaries=[5, 50], tag_keys=("model",))
            self.latency.set_default_tags({"model": "m1"})
            self.inflight = metrics.Gauge("model_pid_gauge", tag_keys=("kind",))

        async def __call__(self, request: Request):
            ms = float(request.query_params.get("ms", "1"))
            self.requests.inc(tags={"route": "/model", "user-agent": "test"})
            self.latency.observe(ms)
            self.inflight.set(os.getpid(), tags={"kind": "replica"})
            return "ok"

    mport = free_port()
    serve.start(http_options={"port": 0, "proxies": 1, "metrics_export_port": mport})
    requests = metrics.Counter("model_requests", "Requests to the model.",
                               tag_keys=("route", "user-agent"))
    serve.run(Model.bind(requests), name="app", route_prefix="/model")
    port = _http_port()
    for ms in (1, 1, 20, 20, 20, 500):
        assert http(port, "GET", f"/model/?ms={ms}")[0] == 200
    requests.inc(2, tags={"route": "driver", "user-agent": "none"})
    assert ray_lite.get(count_in_a_task.remote(metrics.Counter("work_done",
                                                               tag_keys=("where",)), 4),
                        timeout=60) == 4

    s = scrape_metrics(mport)
    # Ray's exported names: ray_<name>, a counter's with _total; a tag key
    # Prometheus cannot take as a label has its "-" made "_".
    assert metric_value(s, "ray_model_requests_total", route="/model", user_agent="test") == 6
    assert metric_value(s, "ray_model_requests_total", route="driver") == 2
    assert metric_value(s, "ray_work_done_total", where="task") == 4
    assert metric_value(s, "ray_model_latency_ms_count", model="m1") == 6
    assert metric_value(s, "ray_model_latency_ms_sum", model="m1") == 562
    assert metric_value(s, "ray_model_latency_ms_bucket", model="m1", le="5.0") == 2
    assert metric_value(s, "ray_model_latency_ms_bucket", model="m1", le="50.0") == 5
    assert metric_value(s, "ray_model_latency_ms_bucket", model="m1", le="+Inf") == 6
    # A gauge: one series per replica process that set it, its last value.
    gauges = [(lab, v) for lab, v in s.get("ray_model_pid_gauge", ())]
    assert gauges and all(lab["kind"] == "replica" and v == float(lab["pid"])
                          for lab, v in gauges)
