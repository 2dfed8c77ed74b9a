"""An HTTP proxy packs a fast route's requests onto its first replicas and
spreads a slow route's (``_routing.choose_for_http``).

Spread over 48 replicas on 2 cores, a fast route's requests each woke a
sleeping replica whose caches the others had evicted; packed, they queue in
a few warm ones (docs/performance.md).  Packing makes a request wait for
the ones ahead of it in its replica, so a slow handler must still be spread.
The routing tests are deterministic; the end-to-end ones send overlapping
requests in enough rounds that the other policy could not pass them."""
import os
import threading

import pytest

from ray_lite import serve
from ray_lite.serve import _routing
from ray_lite.serve._routing import ServiceTime, choose_for_http

from serve_helpers import http

# The proxies' packing (a listening replica runs a fast route's requests itself).
SERVE_HTTP_PROXIES_ONLY = ("test_a_fast_routes_overlapping_requests_go_to_one_replica",)

THRESHOLD_S = _routing.SERVE_PACK_BELOW_S


class _Slot:
    def __init__(self, inflight):
        self.inflight = inflight
        self.streams = None     # (no replica's count of open streams mapped)


def _service(seconds):
    s = ServiceTime()
    s.observe(seconds)
    return s


def test_a_route_is_fast_once_its_answers_average_under_the_threshold():
    s = ServiceTime()
    assert not s.fast()                         # nothing known yet: spread
    s.observe(THRESHOLD_S / 10)
    assert s.fast()
    for _ in range(200):
        s.observe(THRESHOLD_S * 3)
    assert not s.fast()                         # it became slow: spread again
    for _ in range(200):
        s.observe(THRESHOLD_S / 10)
    assert s.fast()


def test_one_preempted_answer_does_not_turn_a_fast_route():
    s = _service(THRESHOLD_S / 10)
    s.observe(5.0)                              # a time slice (or a GC pause) long
    assert s.fast()
    assert s.mean <= THRESHOLD_S / 10 + ServiceTime.ANSWER_CAP_S / 32 + 1e-12


def test_a_route_that_streams_is_spread():
    s = _service(THRESHOLD_S / 10)
    s.observe_stream()
    assert not s.fast()
    s = ServiceTime()
    for _ in range(9):
        s.observe(THRESHOLD_S / 10)
        s.observe(THRESHOLD_S / 10)
        s.observe_stream()                      # one answer in three a stream
    assert not s.fast()


def test_a_fast_route_packs_in_the_controllers_order_up_to_the_limit():
    slots = [_Slot(0) for _ in range(4)]
    fast = _service(THRESHOLD_S / 10)
    for rank in (0, 1, 3):                      # the same order in every proxy
        _routing.set_proxy_rank(rank)
        try:
            assert choose_for_http(slots, 2, fast) is slots[0]
        finally:
            _routing.set_proxy_rank(0)
    slots[0].inflight = 1
    assert choose_for_http(slots, 2, fast) is slots[0]    # busy, under the limit
    slots[0].inflight = 2
    assert choose_for_http(slots, 2, fast) is slots[1]    # full: the next one
    for s in slots:
        s.inflight = 2
    assert choose_for_http(slots, 2, fast) is None        # all full: the request waits
    assert choose_for_http([], 2, fast) is None


def test_a_packed_replica_takes_no_more_than_a_short_wait_of_requests():
    # max_ongoing_requests=100 on a fast route: a replica takes only as many
    # as keep a request's wait behind the others within PACK_WAIT_S.
    slots = [_Slot(0) for _ in range(3)]
    fast = _service(ServiceTime.PACK_WAIT_S / 20)
    assert fast.depth == 20
    slots[0].inflight = 19
    assert choose_for_http(slots, 100, fast) is slots[0]
    slots[0].inflight = 20
    assert choose_for_http(slots, 100, fast) is slots[1]
    for s in slots:
        s.inflight = 20                   # every one at its depth: spread the rest
    slots[2].inflight = 30
    picks = {choose_for_http(slots, 100, fast) for _ in range(50)}
    assert picks == {slots[0], slots[1]}
    assert _service(THRESHOLD_S * 0.99).depth >= 5    # fast: at least Ray's default limit


def test_a_slow_or_unknown_route_is_spread():
    slots = [_Slot(0) for _ in range(4)]
    for service in (ServiceTime(), _service(THRESHOLD_S * 3)):
        slots[0].inflight = 1
        picks = [choose_for_http(slots, 5, service) for _ in range(200)]
        assert slots[0] not in picks                      # busy: another takes it
        assert all(picks.count(s) > 20 for s in slots[1:])


def test_packing_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(_routing, "SERVE_PACK_BELOW_S", 0.0)
    assert not _service(0.0).fast()
    assert choose_for_http([_Slot(1), _Slot(0)], 5, _service(0.0)) is not None


# ------------------------------------------------------------- end to end
ROUNDS = 25
CLIENTS = 4


@serve.deployment(num_replicas=3, max_ongoing_requests=8)
class FastPid:
    async def __call__(self):
        return str(os.getpid())


@serve.deployment(num_replicas=3, max_ongoing_requests=8)
class SlowPid:
    async def __call__(self):
        import time
        time.sleep(THRESHOLD_S * 10)     # a handler that holds its replica (CPU work)
        return str(os.getpid())


def _overlapping_rounds(port, rounds):
    """The replica pids that answered ``rounds`` rounds of ``CLIENTS``
    requests sent at once."""
    pids = []
    errors = []

    def one():
        try:
            status, _, body = http(port, "GET", "/")
            assert status == 200, body
            pids.append(int(body))
        except BaseException as exc:  # noqa: BLE001 (re-raised below)
            errors.append(exc)

    for _ in range(rounds):
        threads = [threading.Thread(target=one) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
            assert not t.is_alive(), "a request got no answer"
    if errors:
        raise errors[0]
    return pids


def test_a_fast_routes_overlapping_requests_go_to_one_replica(serve_port):
    serve.run(FastPid.bind())
    # Enough answers that a slow first one (imports, a cold replica) has
    # left the route's mean.
    first = {int(http(serve_port, "GET", "/")[2]) for _ in range(150)}
    assert len(first) == 1
    pids = _overlapping_rounds(serve_port, ROUNDS)
    assert set(pids) == first, f"spread over {sorted(set(pids))}"


def test_a_slow_routes_overlapping_requests_are_spread(serve_port):
    serve.run(SlowPid.bind())
    http(serve_port, "GET", "/")
    pids = _overlapping_rounds(serve_port, ROUNDS // 2)
    assert len(set(pids)) >= 2, "a slow route's requests queued in one replica"


# ------------------------------------------------- the replica's own side
class _AlwaysSpin:
    """A SpinPolicy that would always spin, and counts the spins asked for."""

    def __init__(self):
        self.runs = 0

    def observe(self, waited):
        pass

    def worth_it(self):
        return True

    def run(self, spin, *args):
        self.runs += 1
        return False


def _replica_with(cls, monkeypatch):
    """A replica object made in this process (no runtime, no links)."""
    import cloudpickle

    from ray_lite.serve import _replica, context
    monkeypatch.setattr(_replica, "_SPIN_S", 0.001)
    # The replica sets the process's replica context: put it back after.
    monkeypatch.setattr(context, "_replica_context", context._replica_context)
    rep = _replica.ServeReplica(None, "app", "D", "r0", cloudpickle.dumps(cls), (), {}, {})
    rep._spin = _AlwaysSpin()
    return rep


def _get(rep, lone=True):
    return rep.handle_http("GET", "/", b"", b"host:x", b"", "127.0.0.1:1", "", "1.1",
                           "127.0.0.1:8000", lone)


class _Hi:
    async def __call__(self, request):
        return "hi"


def test_an_answer_carries_the_handlers_time(monkeypatch):
    import asyncio
    rep = _replica_with(_Hi, monkeypatch)
    status, _, body, token, service_s = asyncio.run(_get(rep))
    assert (status, body, token) == (200, b"hi", 0)
    assert 0 <= service_s < 5.0


@pytest.mark.parametrize("lone, free, spins", [
    (True, True, 1),
    (False, True, 0),         # the proxy serves other clients too: they need the CPU
    (True, False, 0),         # more threads run than there are CPUs
])
def test_a_replica_spins_for_a_lone_clients_next_request_while_a_cpu_is_free(
        monkeypatch, lone, free, spins):
    import asyncio

    from ray_lite.serve import _replica
    rep = _replica_with(_Hi, monkeypatch)
    monkeypatch.setattr(_replica, "cpu_free", lambda: free)

    async def main():
        await _get(rep, lone)
        await asyncio.sleep(0)              # the spin is called soon after the answer
        return rep._spin.runs

    assert asyncio.run(main()) == spins


@pytest.mark.parametrize("loadavg, free", [
    (b"0.50 0.40 0.30 1/120 4242\n", True),      # only this thread runs
    (b"2.50 2.40 2.30 %d/120 4242\n", False),    # one more than the CPUs
    (b"garbage", True),                          # unreadable: as before, spin
])
def test_a_cpu_is_free_while_no_more_threads_run_than_there_are_cpus(monkeypatch, loadavg,
                                                                     free):
    from ray_lite.serve import _spin
    if b"%d" in loadavg:
        loadavg = loadavg % (_spin._CPUS + 1)
    assert _spin.cpu_free() in (True, False)     # the real file: read and parsed
    assert _spin._loadavg_fd >= 0
    monkeypatch.setattr(_spin.os, "pread", lambda fd, n, off: loadavg)
    assert _spin.cpu_free() is free
