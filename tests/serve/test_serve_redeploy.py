"""``serve.run`` of an application that runs already, as Ray Serve does it:
a deployment redeployed without a code version (every ``serve.run``) gets
new replicas even when nothing changed; the old ones serve until the new
ones are ready, then stop (their multiplexed models unloaded, their
``__del__`` run) before ``serve.run`` returns.  A versioned redeploy (a
config file's unchanged code) keeps its replicas.  Over HTTP, through the
proxies and with direct ingress: no request fails during a redeploy, and a
request in flight when its server stops (a redeploy, ``serve.shutdown``)
gets its answer first."""
import asyncio
import os
import socket
import threading

import pytest

from ray_lite import serve
from ray_lite.serve import _core, context

from serve_helpers import connection_to, http, listens, process_gone, serve_pids, wait_until

# Each test that takes serve_port (or serve_http_mode) runs through the
# proxies and with direct ingress (conftest).
SERVE_HTTP_MODES = ("proxies", "direct")


def _replica_pids(app, dep):
    ids = _core.get(context.get_controller().process_ids.remote(), timeout=30)
    return sorted(ids["replicas"].get(f"{app}/{dep}", []))


class _Model:
    def __init__(self, model_id, path):
        self.model_id, self.path = model_id, path

    def __del__(self):
        with open(self.path, "a") as f:
            f.write(f"{self.model_id} {os.getpid()}\n")


@serve.deployment(num_replicas=1)
class Models:
    def __init__(self, path):
        self.path = path

    @serve.multiplexed(max_num_models_per_replica=4)
    async def get_model(self, model_id: str):
        return _Model(model_id, self.path)

    async def infer(self):
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.model_id, os.getpid()


def test_running_the_same_app_again_replaces_its_replicas_and_unloads_their_models(
        serve_runtime, tmp_path):
    unloaded = tmp_path / "unloaded"
    handle = serve.run(Models.bind(str(unloaded)), name="models", route_prefix=None)
    pids = set()
    for m in ("a", "b"):
        model, pid = handle.options(multiplexed_model_id=m).infer.remote().result(
            timeout_s=30)
        assert model == m
        pids.add(pid)
    (old,) = pids
    assert not unloaded.exists()

    handle = serve.run(Models.bind(str(unloaded)), name="models", route_prefix=None)
    # The old replica has stopped by now, and its models went with it.
    assert sorted(unloaded.read_text().split("\n")[:-1]) == [f"a {old}", f"b {old}"]
    wait_until(lambda: process_gone(old), "the old replica's end")
    (new,) = _replica_pids("models", "Models")
    assert new != old
    assert handle.options(multiplexed_model_id="a").infer.remote().result(
        timeout_s=30) == ("a", new)
    assert serve.status().applications["models"].status == "RUNNING"


@serve.deployment(num_replicas=2)
class Pid:
    def __call__(self, request=None):
        return str(os.getpid())


def test_http_answers_throughout_a_redeploy(serve_port):
    serve.run(Pid.bind(), name="p", route_prefix="/p")
    before = _replica_pids("p", "Pid")
    statuses = []
    stop = threading.Event()

    def load():
        for _ in range(100_000):
            if stop.is_set():
                return
            try:
                statuses.append(http(serve_port, "GET", "/p", timeout=30)[0])
            except OSError as exc:      # a connection reset or ended unanswered
                statuses.append(repr(exc))
    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        serve.run(Pid.bind(), name="p", route_prefix="/p")
    finally:
        stop.set()
        t.join(60)
    assert not t.is_alive()
    assert statuses and set(statuses) == {200}
    after = _replica_pids("p", "Pid")
    assert len(after) == 2 and not set(after) & set(before)
    wait_until(lambda: all(process_gone(pid) for pid in before), "the old replicas' end")


def test_a_redeploy_of_the_same_code_version_keeps_the_replicas(serve_runtime):
    # A config file applied again with unchanged code carries its code
    # version (config.apply): Ray's lightweight update, the replicas stay.
    serve.run(Pid.bind(), name="v", route_prefix=None, _code_version="v1")
    before = _replica_pids("v", "Pid")
    serve.run(Pid.bind(), name="v", route_prefix=None, _code_version="v1")
    assert _replica_pids("v", "Pid") == before
    serve.run(Pid.bind(), name="v", route_prefix=None, _code_version="v2")
    assert not set(_replica_pids("v", "Pid")) & set(before)


@serve.deployment(num_replicas=1)
class Held:
    async def __call__(self, request):
        """Says its pid to the test's door (a socket at ``?door=`` port) and
        answers once the door sends a byte; its pid without a door."""
        if "door" not in request.query_params:
            return str(os.getpid())
        reader, writer = await asyncio.open_connection("127.0.0.1",
                                                       int(request.query_params["door"]))
        writer.write(b"%d\n" % os.getpid())
        await reader.read(1)
        writer.close()
        return "answered"


def _answer(s):
    """(head, body) of one answer on ``s``: a body of content-length bytes."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                  if line.startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, body
        body += chunk
    return head.lower(), body


@pytest.mark.parametrize("how", ["redeploy", "shutdown"])
def test_a_request_in_flight_is_answered_before_its_server_stops(serve_port, serve_http_mode,
                                                                 how):
    """Graceful drain: the process that took the connection (the proxy; with
    direct ingress, the replica itself) stops listening, answers the
    request in flight, then ends the connection if it stops too."""
    serve.run(Held.bind(), name="h", route_prefix="/h")
    pids = serve_pids()
    (proxy,), (old,) = pids["proxies"], pids["replicas"]["h/Held"]
    holder = old if serve_http_mode == "direct" else proxy
    door = socket.create_server(("127.0.0.1", 0))
    door.settimeout(30)
    stopper = threading.Thread(
        target=(lambda: serve.run(Held.bind(), name="h", route_prefix="/h")) if how == "redeploy"
        else serve.shutdown, daemon=True)
    try:
        with connection_to(serve_port, holder) as s:
            s.sendall(b"GET /h?door=%d HTTP/1.1\r\nHost: x\r\n\r\n" % door.getsockname()[1])
            inside, _ = door.accept()
            with inside:
                with inside.makefile("rb") as f:
                    assert int(f.readline()) == old
                stopper.start()
                if how == "redeploy":      # the old replica stops once the new one is up
                    wait_until(lambda: serve_pids()["replicas"].get("h/Held", []) not in
                               ([], [old]), "the new replica")
                if how == "shutdown" or serve_http_mode == "direct":
                    wait_until(lambda: not listens(holder, serve_port),
                               "the holder to stop listening")
                inside.sendall(b"!")
                head, body = _answer(s)
            assert head.startswith(b"http/1.1 200 ") and body == b"answered"
            if holder == proxy and how == "redeploy":
                # The proxy stays: the connection too, now to the new replica.
                s.sendall(b"GET /h HTTP/1.1\r\nHost: x\r\n\r\n")
                assert int(_answer(s)[1]) != old
            else:
                assert b"\r\nconnection: close" in head
                assert s.recv(65536) == b""
        stopper.join(60)
        assert not stopper.is_alive()
        wait_until(lambda: process_gone(old), "the old replica's end")
    finally:
        door.close()
        stopper.join(60)
