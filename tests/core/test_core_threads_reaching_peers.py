"""Threads that reach a new peer (or free resources) while another thread of
the same process sleeps in the drive loop get their answer: the sleeper is
woken, two threads reaching one peer share one link, and two actors reaching
each other at once both get their answers."""
import asyncio
import threading
import time

import ray_lite as ray
from test_core_objects import Gate

T = 60


def test_threads_of_an_actor_reaching_a_new_peer_at_once_share_one_link(rt):
    # Each thread used to make its own link; the second replaced (and closed)
    # the first, and the peer, attaching the closed one, died.
    @ray.remote
    class Peer:
        async def ping(self, i):
            return i

    @ray.remote(max_concurrency=8)
    class Caller:
        def call(self, peer, i):
            return ray.get(peer.ping.remote(i))
    for _ in range(3):
        peer, caller = Peer.remote(), Caller.remote()
        assert ray.get([caller.call.remote(peer, i) for i in range(8)], timeout=T) == \
            list(range(8))
        assert ray.get(peer.ping.remote(-1), timeout=T) == -1



@ray.remote
class _Pinged:
    async def ping(self, i):
        return i


@ray.remote
class _Mailbox:
    def __init__(self):
        self.letters = asyncio.Queue()

    async def put(self, letter):
        self.letters.put_nowait(letter)

    async def take(self):
        return await self.letters.get()


def _until(cond):
    deadline = time.monotonic() + T
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.001)


def _until_the_links_sleep(node):
    """Until a thread of ``node``'s process sleeps in poll on the links it had
    (``drive._poll``): a link made now is not among them."""
    _until(lambda: node._polling)


def test_a_thread_of_an_actor_reaching_a_new_peer_while_its_links_sleep_gets_the_answer(rt):
    # The actor's main thread slept in poll on the one link it had (to the
    # driver) and held the drive lock; a method's thread made a link to a new
    # peer, whose answer came on it: nothing woke the sleep, and the call hung.
    @ray.remote(max_concurrency=2)
    class Caller:
        def call(self, peer, i):
            from ray_lite._private.process import state
            _until_the_links_sleep(state.node)
            return ray.get(peer.ping.remote(i), timeout=T)
    caller = Caller.remote()
    for i in range(3):
        assert ray.get(caller.call.remote(_Pinged.remote(), i), timeout=T) == i


def test_a_thread_an_actor_started_reaching_a_new_peer_while_the_actor_idles_gets_the_answer(rt):
    # The same with one method thread (the main thread), idle: it slept on
    # its one link's ring, which only a message on that link wakes.
    @ray.remote
    class Background:
        def __init__(self, peer, mailbox):
            from ray_lite._private.process import state
            node = state.node

            def reach():
                _until(node._drive_lock.locked)    # the main thread idles in the drive loop
                mailbox.put.remote(ray.get(peer.ping.remote(5), timeout=T))
            threading.Thread(target=reach, daemon=True).start()

    mailbox = _Mailbox.remote()
    background = Background.remote(_Pinged.remote(), mailbox)
    assert ray.get(mailbox.take.remote(), timeout=T) == 5
    del background


def test_a_driver_thread_reaching_a_new_actor_while_another_thread_waits_gets_the_answer(rt):
    # The same in the driver: the main thread sleeps in poll (in get) on the
    # links it had; another thread starts an actor and calls it.
    mailbox = _Mailbox.remote()

    def reach_a_new_actor():
        try:
            _until_the_links_sleep(rt)
            answer = ray.get(_Pinged.remote().ping.remote(7), timeout=T)
        except BaseException as exc:    # noqa: BLE001 - told to the main thread
            answer = exc
        mailbox.put.remote(answer)
    t = threading.Thread(target=reach_a_new_actor)
    t.start()
    try:
        assert ray.get(mailbox.take.remote(), timeout=T) == 7
    finally:
        t.join(T)


def test_an_actor_waiting_for_resources_starts_when_another_thread_frees_them(rt):
    # Creating an actor that does not fit waits (asleep in poll, driving the
    # links) until resources are free; freed by another thread (a placement
    # group removed), they came with no message: nothing woke the wait.
    from ray_lite.util.placement_group import placement_group, remove_placement_group

    @ray.remote(num_cpus=2)
    class Big:
        def ping(self):
            return "pong"

    group = placement_group([{"CPU": 2}])
    ray.get(group.ready(), timeout=T)
    answers = []

    def start_big():
        answers.append(ray.get(Big.remote().ping.remote(), timeout=T))
    t = threading.Thread(target=start_big)
    t.start()
    _until_the_links_sleep(rt)
    remove_placement_group(group)
    t.join(T)
    assert answers == ["pong"]


@ray.remote(max_concurrency=2)
class _Mutual:
    def __init__(self, name):
        self.name = name

    def ping(self):
        return self.name

    def call_when_open(self, gate, other):
        ray.get(gate.wait.remote())
        return ray.get(other.ping.remote())


def test_two_actors_calling_each_other_first_at_once_both_get_their_answers(rt):
    # Each makes a link to the other before the other's reaches it.  The
    # second link used to replace the first on each side: the calls sent on
    # the replaced one were never read (and a loop watching it spun).
    for _ in range(3):
        gate = Gate.remote()
        pairs = [(_Mutual.remote(f"a{i}"), _Mutual.remote(f"b{i}")) for i in range(4)]
        calls = []
        for a, b in pairs:
            calls += [a.call_when_open.remote(gate, b), b.call_when_open.remote(gate, a)]
        ray.get(gate.open.remote(), timeout=T)
        assert ray.get(calls, timeout=T) == [n for i in range(4) for n in (f"b{i}", f"a{i}")]
        # Later calls, both ways, on the links that stayed.
        for a, b in pairs:
            assert ray.get([a.call_when_open.remote(gate, b), b.call_when_open.remote(gate, a)],
                           timeout=T) == [ray.get(b.ping.remote(), timeout=T),
                                          ray.get(a.ping.remote(), timeout=T)]
        for actor in [gate] + [x for p in pairs for x in p]:
            ray.kill(actor)
