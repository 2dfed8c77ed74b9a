"""Direct ingress (``http_options["direct_ingress"]``): the ingress replicas
listen on the application's port beside the proxy and run the requests of
their own route in their own process; what they should not take goes over
the rings to the replica the router picks."""
import asyncio
import os
import socket

import ray_lite as ray
from ray_lite import serve
from ray_lite.serve._direct import direct_ingress_on
from ray_lite.serve.api import _http_port

from serve_helpers import (_server_inode, _socket_inodes, connection_to, http,
                           refused_and_waiting, wait_until)


@serve.deployment
def whoami(request):
    return str(os.getpid())


def _serve_direct():
    serve.start(http_options={"port": 0, "proxies": 1, "request_timeout_s": 10,
                              "direct_ingress": True})
    return _http_port()


def test_the_switch_is_the_option_else_rays_variable_else_on(monkeypatch):
    monkeypatch.delenv("RAY_SERVE_ENABLE_DIRECT_INGRESS", raising=False)
    assert direct_ingress_on({})
    assert not direct_ingress_on({"direct_ingress": False})
    for off in ("0", "false", "No"):
        monkeypatch.setenv("RAY_SERVE_ENABLE_DIRECT_INGRESS", off)
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


@serve.deployment(max_ongoing_requests=1, max_queued_requests=0)
class Holder:
    """Answers its pid, after ``?s=`` seconds (cut short when the client leaves)."""

    async def __call__(self, request):
        await asyncio.sleep(float(request.query_params.get("s", "0")))
        return str(os.getpid())


def _running(app, deployment):
    """The requests the deployment's replicas run (asked of each replica
    directly: a handle call would wait for one of its slots)."""
    ctl = serve.context.get_controller()
    reps = ray.get(ctl.replica_handles.remote(app, deployment), timeout=30)
    return sum(ray.get(r.num_ongoing.remote(), timeout=30) for r in reps)


def _processes(app, deployment):
    ids = ray.get(serve.context.get_controller().process_ids.remote(), timeout=30)
    return ids["replicas"][f"{app}/{deployment}"], ids["proxies"][0]


def _hold(port, pid):
    """A connection that ``pid``'s own listener took, its request running there."""
    s = connection_to(port, pid)
    s.sendall(b"GET /?s=60 HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until(lambda: _running("default", "Holder") == 1, "the held request to run", 30)
    return s


def test_a_replica_full_with_its_own_requests_is_full_for_the_proxy(serve_runtime):
    # Its limit (1) is taken by a request of its own listener: the proxy
    # counts it, and refuses the next (max_queued_requests=0) instead of
    # sending it there to wait behind the first.
    port = _serve_direct()
    serve.run(Holder.bind())
    (replica,), proxy = _processes("default", "Holder")
    held = _hold(port, replica)
    try:
        with connection_to(port, proxy) as s:
            s.settimeout(30)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 503")
    finally:
        held.close()
    # Freed once its client left: the proxy sends there again.
    wait_until(lambda: _running("default", "Holder") == 0, "the slot to free", 30)
    assert http(port, "GET", "/")[2] == str(replica).encode()


def test_the_proxy_sends_to_a_replica_its_own_requests_left_free(serve_runtime):
    # One listener: the proxy keeps listening (it steps aside for two).
    port = _serve_direct_listeners(1)
    serve.run(Holder.options(num_replicas=2, max_queued_requests=-1).bind())
    replicas, proxy = _processes("default", "Holder")
    wait_until(lambda: len(_listening_pids(port, replicas)) == 1, "one replica to listen", 30)
    (listener,) = _listening_pids(port, replicas)
    (other,) = set(replicas) - {listener}
    held = _hold(port, listener)
    try:
        for _ in range(8):      # each served at once, by the other replica
            with connection_to(port, proxy) as s:
                s.settimeout(30)
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = s.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200")
            assert answer.endswith(str(other).encode())
    finally:
        held.close()


def test_a_request_waiting_at_the_proxy_goes_when_the_replicas_own_one_ends(serve_runtime):
    # Nothing tells the proxy when a replica's own request ends: the requests
    # waiting in its queue look again until the slot is free.
    port = _serve_direct()
    serve.run(Holder.options(max_queued_requests=1).bind())
    (replica,), proxy = _processes("default", "Holder")
    held = _hold(port, replica)
    with connection_to(port, proxy) as a, connection_to(port, proxy) as b:
        for s in (a, b):
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        # The queue (of one) is full: one is refused, the other waits at the proxy.
        refused, waiting = refused_and_waiting(a, b)
        assert refused.recv(65536).startswith(b"HTTP/1.1 503")
        held.close()
        waiting.settimeout(30)
        answer = b""
        while not answer.endswith(str(replica).encode()):
            chunk = waiting.recv(65536)
            assert chunk, "the waiting request was never answered"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")


class _Slot:
    def __init__(self, inflight, taken_directly):
        self.inflight = inflight
        self.actor_id = id(self)
        self.model_ranks = {}
        self.streams = memoryview(bytearray(16)).cast("q")     # a ReplicaCell's view
        self.streams[1] = taken_directly


def test_the_choice_counts_each_replicas_own_requests_against_its_limit():
    from ray_lite.serve import _proxy
    busy, free = _Slot(0, 2), _Slot(1, 0)
    route = _proxy._Route("/", "default", "d", [busy, free], 2, -1)
    # Whatever the draw, never the replica its own listener filled.
    assert {_proxy._choose_beside_direct(route, None) for _ in range(50)} == {free}
    free.streams[1] = 1         # 1 of this caller's + 1 of its own: full too
    assert _proxy._choose_beside_direct(route, None) is None
    busy.streams[1] = 1         # one of its own left
    assert _proxy._choose_beside_direct(route, None) is busy


def _listeners(port):
    """The inodes of the sockets listening on ``port`` (IPv4 loopback)."""
    with open("/proc/net/tcp") as f:
        next(f)
        return {int(fields[9]) for fields in map(str.split, f)
                if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port}


def _listening_pids(port, pids):
    listening = _listeners(port)
    return {pid for pid in pids if _socket_inodes(pid) & listening}


def test_as_many_replicas_listen_as_the_machine_has_cores(serve_runtime):
    port = _serve_direct()
    serve.run(whoami.options(num_replicas=3).bind())
    replicas, proxy = _processes("default", "whoami")
    cores = len(os.sched_getaffinity(0))
    # Counted once each has started: a replica asks before it joins.
    wait_until(lambda: len(_listening_pids(port, replicas)) == min(3, cores),
               f"{min(3, cores)} replicas to listen", 30)
    # The proxy steps aside while two listen (one on a single core).
    wait_until(lambda: bool(_listening_pids(port, [proxy])) == (cores < 2),
               "the proxy to step aside" if cores >= 2 else "the proxy to listen", 30)


def _serve_direct_listeners(n):
    serve.start(http_options={"port": 0, "proxies": 1, "request_timeout_s": 10,
                              "direct_ingress": True, "direct_ingress_listeners": n})
    return _http_port()


def test_the_replicas_beyond_the_listeners_stand_by_and_still_serve(serve_runtime):
    port = _serve_direct_listeners(1)
    serve.run(Holder.options(num_replicas=3, max_queued_requests=-1).bind())
    replicas, _ = _processes("default", "Holder")
    wait_until(lambda: len(_listening_pids(port, replicas)) == 1, "one replica to listen", 30)
    (listener,) = _listening_pids(port, replicas)
    held = _hold(port, listener)
    try:
        # Whoever accepts them (the proxy, the full listener), the requests
        # go to the replicas standing by.
        for _ in range(8):
            status, _, body = http(port, "GET", "/")
            assert status == 200 and int(body) in set(replicas) - {listener}
    finally:
        held.close()


def test_a_listener_that_dies_is_replaced_by_a_replica_standing_by(serve_runtime):
    import signal
    port = _serve_direct_listeners(1)
    serve.run(whoami.options(num_replicas=2).bind())
    replicas, _ = _processes("default", "whoami")
    wait_until(lambda: len(_listening_pids(port, replicas)) == 1, "one replica to listen", 30)
    (listener,) = _listening_pids(port, replicas)
    (standby,) = set(replicas) - {listener}
    os.kill(listener, signal.SIGKILL)   # a replica this test's runtime started
    # The one standing by listens at once, not its dead mate's replacement.
    wait_until(lambda: _listening_pids(port, [standby]) == {standby},
               "the replica standing by to listen", 30)
    assert http(port, "GET", "/")[0] == 200
    # Its replacement, once up, stands by: one listener, as asked.
    wait_until(lambda: len(_processes("default", "whoami")[0]) == 2 and
               listener not in _processes("default", "whoami")[0], "the replacement", 30)
    replicas, _ = _processes("default", "whoami")
    assert _listening_pids(port, replicas) == {standby}


@serve.deployment(health_check_period_s=0.05, health_check_timeout_s=5)
class FailsWhenTold:
    """Fails its health checks once a file named after its pid exists."""

    def __init__(self, folder):
        self.mark = os.path.join(folder, str(os.getpid()))

    def check_health(self):
        if os.path.exists(self.mark):
            raise RuntimeError("told to fail")

    def __call__(self, request):
        return str(os.getpid())


def test_a_listener_taken_out_of_service_hands_its_place_on(serve_runtime, tmp_path):
    # Failing its health checks, the listener is drained (not killed): a
    # replica standing by listens before it goes.
    port = _serve_direct_listeners(1)
    serve.run(FailsWhenTold.options(num_replicas=2).bind(str(tmp_path)))
    replicas, _ = _processes("default", "FailsWhenTold")
    wait_until(lambda: len(_listening_pids(port, replicas)) == 1, "one replica to listen", 30)
    (listener,) = _listening_pids(port, replicas)
    (standby,) = set(replicas) - {listener}
    (tmp_path / str(listener)).touch()
    wait_until(lambda: _listening_pids(port, [standby]) == {standby},
               "the replica standing by to listen", 30)
    wait_until(lambda: listener not in _processes("default", "FailsWhenTold")[0] and
               len(_processes("default", "FailsWhenTold")[0]) == 2, "the replacement", 30)
    replicas, _ = _processes("default", "FailsWhenTold")
    assert _listening_pids(port, replicas) == {standby}
    assert http(port, "GET", "/")[0] == 200


@serve.deployment
class HeldAtStart:
    """Answers its pid; a replica started while ``folder/door`` names a port
    waits in its constructor for a byte from there."""

    def __init__(self, folder):
        door = os.path.join(folder, "door")
        if os.path.exists(door):
            with socket.create_connection(("127.0.0.1", int(open(door).read())),
                                          timeout=60) as s:
                s.recv(1)

    def __call__(self, request):
        return str(os.getpid())


def test_the_proxy_steps_aside_while_two_replicas_listen(serve_runtime, tmp_path):
    import signal
    port = _serve_direct_listeners(2)
    serve.run(HeldAtStart.options(num_replicas=2).bind(str(tmp_path)))
    replicas, proxy = _processes("default", "HeldAtStart")
    wait_until(lambda: _listening_pids(port, replicas + [proxy]) == set(replicas),
               "the replicas to listen and the proxy to step aside", 30)
    for _ in range(8):
        status, _, body = http(port, "GET", "/")
        assert status == 200 and int(body) in replicas
    # One listener dies: the proxy takes connections again, beside the one
    # left, while the replacement starts (held in its constructor here).
    with socket.create_server(("127.0.0.1", 0)) as door:
        (tmp_path / "door").write_text(str(door.getsockname()[1]))
        os.kill(replicas[0], signal.SIGKILL)    # a replica this test's runtime started
        door.settimeout(30)
        held, _ = door.accept()     # the replacement, in its constructor
        with held:
            wait_until(lambda: _listening_pids(port, [proxy]) == {proxy},
                       "the proxy to listen", 30)
            assert _listening_pids(port, [replicas[1]]) == {replicas[1]}
            with connection_to(port, proxy) as via_proxy:    # (it takes SYNs again)
                via_proxy.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert via_proxy.recv(65536).startswith(b"HTTP/1.1 200")
            held.sendall(b"x")
    # The replacement listens: the proxy steps aside again.
    wait_until(lambda: len(_processes("default", "HeldAtStart")[0]) == 2 and
               replicas[0] not in _processes("default", "HeldAtStart")[0], "the replacement", 30)
    now, _ = _processes("default", "HeldAtStart")
    wait_until(lambda: _listening_pids(port, now + [proxy]) == set(now),
               "the replacement to listen and the proxy to step aside", 30)
    assert http(port, "GET", "/")[0] == 200


def test_a_connection_the_proxy_took_is_served_after_it_steps_aside(serve_runtime):
    port = _serve_direct_listeners(2)
    serve.run(whoami.options(num_replicas=1).bind())
    (replica,), proxy = _processes("default", "whoami")
    wait_until(lambda: _listening_pids(port, [replica, proxy]) == {replica, proxy},
               "the replica and the proxy to listen", 30)
    with connection_to(port, proxy) as kept:
        serve.run(whoami.options(num_replicas=2).bind())
        wait_until(lambda: not _listening_pids(port, [proxy]), "the proxy to step aside", 30)
        kept.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = kept.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200")
    # The listeners stop with their application: the proxy is back first.
    serve.delete("default")
    assert _listening_pids(port, [proxy]) == {proxy}
    assert http(port, "GET", "/")[0] == 404


def test_the_listeners_option_is_checked():
    import pytest

    from ray_lite.serve import HTTPOptions
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="direct_ingress_listeners"):
            HTTPOptions(direct_ingress_listeners=bad)
    assert HTTPOptions(direct_ingress_listeners=2).to_dict()["direct_ingress_listeners"] == 2
