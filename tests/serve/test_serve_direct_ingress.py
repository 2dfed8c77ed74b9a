"""Direct ingress (``http_options["direct_ingress"]``): the ingress replicas
listen on the application's port beside the proxy and run the requests of
their own route in their own process; what they should not take goes over
the rings to the replica the router picks."""
import os
import socket

import ray_lite as ray
from ray_lite import serve
from ray_lite.serve._direct import direct_ingress_on
from ray_lite.serve.api import _http_port

from serve_helpers import _server_inode, _socket_inodes, http


@serve.deployment
def whoami(request):
    return str(os.getpid())


def _serve_direct():
    serve.start(http_options={"port": 0, "proxies": 1, "request_timeout_s": 10,
                              "direct_ingress": True})
    return _http_port()


def test_the_switch_is_the_option_else_rays_variable(monkeypatch):
    monkeypatch.delenv("RAY_SERVE_ENABLE_DIRECT_INGRESS", raising=False)
    assert not direct_ingress_on({})
    assert direct_ingress_on({"direct_ingress": True})
    monkeypatch.setenv("RAY_SERVE_ENABLE_DIRECT_INGRESS", "1")
    assert direct_ingress_on({})
    assert not direct_ingress_on({"direct_ingress": False})


def test_a_connection_a_replica_accepted_runs_in_that_replica(serve_runtime):
    port = _serve_direct()
    serve.run(whoami.bind())
    ids = ray.get(serve.context.get_controller().process_ids.remote(), timeout=30)
    (replica,) = ids["replicas"]["default/whoami"]
    (proxy,) = ids["proxies"]
    taken_by = set()
    for _ in range(64):     # the kernel spreads connections over both listeners
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = s.recv(65536)
            inode = _server_inode(port, s.getsockname()[1])
            owner = replica if inode in _socket_inodes(replica) else \
                proxy if inode in _socket_inodes(proxy) else None
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(str(replica).encode())
        taken_by.add(owner)
        if taken_by == {replica, proxy}:
            break
    assert taken_by == {replica, proxy}


@serve.deployment
def other(request):
    return "other:" + str(os.getpid())


def test_another_applications_route_goes_to_its_replica(serve_runtime):
    port = _serve_direct()
    serve.run(whoami.bind(), name="a", route_prefix="/a")
    serve.run(other.bind(), name="b", route_prefix="/b")
    ids = ray.get(serve.context.get_controller().process_ids.remote(), timeout=30)
    (b_pid,) = ids["replicas"]["b/other"]
    (a_pid,) = ids["replicas"]["a/whoami"]
    for _ in range(16):
        assert http(port, "GET", "/b")[2] == f"other:{b_pid}".encode()
        assert http(port, "GET", "/a")[2] == str(a_pid).encode()
    assert http(port, "GET", "/c")[0] == 404


def test_a_replica_that_is_not_an_ingress_does_not_listen(serve_runtime):
    @serve.deployment
    class Inner:
        def __call__(self):
            return os.getpid()

    @serve.deployment
    class Outer:
        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, request):
            return f"{os.getpid()} {await self.inner.remote()}"

    port = _serve_direct()
    serve.run(Outer.bind(Inner.bind()))
    ids = ray.get(serve.context.get_controller().process_ids.remote(), timeout=30)
    (inner,) = ids["replicas"]["default/Inner"]
    listening = {int(line.split()[9]) for line in open("/proc/net/tcp").readlines()[1:]
                 if line.split()[3] == "0A" and
                 int(line.split()[1].split(":")[1], 16) == port}
    assert listening and not listening & _socket_inodes(inner)
    assert http(port, "GET", "/")[2].split()[1] == str(inner).encode()
