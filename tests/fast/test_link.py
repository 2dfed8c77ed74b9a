"""The link (a ring each way), both twins (``link_impl``): sending, reading,
closing, the lock between sending threads, and ``drain``, which reads many
links and dispatches their messages."""
import threading

import pytest

from ray_lite._fast.errors import LinkClosed, SerializationError

SMALL = 4096


@pytest.fixture
def rings(twin):
    """The ring module that goes with the link twin (the compiled link takes
    compiled rings only)."""
    return twin.module("ring")


@pytest.fixture
def pair(link_impl):
    """Both ends of one link, in this process."""
    a = link_impl.Link.create()
    b = link_impl.Link.attach(a.names)
    yield a, b
    a.close()
    b.close()


def small_link(link_impl, rings):
    """A link to itself over one small ring (so that it fills)."""
    tx = rings.ShmRing.create(SMALL, side="producer")
    rx = rings.ShmRing.attach(tx.name, side="consumer")
    return link_impl.Link((tx.name, tx.name), tx, rx)


def test_messages_arrive_in_order_both_ways(pair):
    a, b = pair
    sent = [("call", i, "x" * i, [i], None) for i in range(200)]
    for m in sent:
        a.send(m)
    assert b.has_data()
    assert b.recv_all() == sent
    assert not b.has_data() and b.recv_all() == []
    b.send(("reply", 1))
    assert a.recv_wait(30) == ("reply", 1)
    assert a.recv_wait(0) is None


def test_closing_either_end_raises_link_closed_and_delivers_what_was_sent(pair):
    a, b = pair
    a.send(("before", 1))
    a.close()
    a.close()                                   # twice: nothing more
    with pytest.raises(LinkClosed):
        a.send(("after",))
    with pytest.raises(LinkClosed):
        a.recv_wait(0)
    assert a.recv_all() == [] and a.has_data() and a.spin_poll(0) and a.arm()
    assert b.recv_all() == [("before", 1)]
    with pytest.raises(LinkClosed):
        b.recv_wait(5)
    with pytest.raises(LinkClosed):
        b.send(("to a closed peer",))


def test_an_unserialisable_message_raises_and_the_link_stays_usable(pair):
    a, b = pair
    with pytest.raises(SerializationError):
        a.send(("call", threading.Lock()))
    a.send(("next", 2))                         # the lock was given back
    assert b.recv_all() == [("next", 2)]


def test_a_full_ring_calls_on_full_until_there_is_room(link_impl, rings):
    link = small_link(link_impl, rings)
    try:
        read = []

        def on_full():
            read.extend(link.recv_all())
        link.on_full = on_full
        sent = [("item", i, "y" * 200) for i in range(100)]     # far more than 4 KiB
        for m in sent:
            link.send(m)
        assert read, "the ring never filled: the test tests nothing"
        assert read + link.recv_all() == sent
    finally:
        link.close()


def test_a_second_sender_waits_for_the_first_holding_the_lock(link_impl, rings):
    # With no on_full, a send waits on a full ring holding the lock; a second
    # thread's send waits for the lock, and both go through once it drains.
    link = small_link(link_impl, rings)
    try:
        filler = ("fill", "z" * 200)
        while True:
            try:
                link._tx.put(filler, 0)
            except TimeoutError:
                break
        done = []
        threads = [threading.Thread(target=lambda i=i: (link.send(("blocked", i)), done.append(i)))
                   for i in range(2)]
        for t in threads:
            t.start()
        got = []
        for _ in range(2000):           # bounded: each round reads what is there
            got.extend(m for m in link.recv_all() if m != filler)
            if len(got) == 2:
                break
            m = link.recv_wait(0.01)        # (bounded: paces the loop; keeps what it reads)
            if m is not None and m != filler:
                got.append(m)
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        got.extend(m for m in link.recv_all() if m != filler)
        assert sorted(got) == [("blocked", 0), ("blocked", 1)] and sorted(done) == [0, 1]
    finally:
        link.close()


def test_drain_dispatches_each_message_to_its_handler_with_its_peer(link_impl):
    links = [link_impl.Link.loopback() for _ in range(12)]     # > 8: the twin's map path too
    try:
        seen = []
        handlers = {"a": lambda peer, m: seen.append((peer, m)),
                    "b": lambda peer, m: seen.append((peer, m[1] * 10))}
        entries = tuple((f"peer{i}", link, link._rx.poll) for i, link in enumerate(links))
        polls = tuple(e[2] for e in entries)
        links[0].send(("a", 1))
        links[0].send(("b", 2))
        links[11].send(("a", 3))
        stash = []
        assert link_impl.drain(entries, polls, handlers, stash) == 3
        assert seen == [("peer0", ("a", 1)), ("peer0", 20), ("peer11", ("a", 3))]
        assert stash == []
        assert link_impl.drain(entries, polls, handlers, stash) == 0
        links[5].close()                                        # a closed link is passed over
        links[6].send(("a", 4))
        assert link_impl.drain(entries, polls, handlers, stash) == 1
        assert seen[-1] == ("peer6", ("a", 4))
    finally:
        for link in links:
            link.close()


def test_drain_keeps_what_it_read_after_a_handler_raised(link_impl):
    link = link_impl.Link.loopback()
    try:
        seen = []

        def boom(peer, m):
            raise KeyboardInterrupt
        handlers = {"ok": lambda peer, m: seen.append(m), "boom": boom}
        entries = (("p", link, link._rx.poll),)
        for m in [("ok", 1), ("boom",), ("ok", 2), ("ok", 3)]:
            link.send(m)
        stash = []
        with pytest.raises(KeyboardInterrupt):
            link_impl.drain(entries, (entries[0][2],), handlers, stash)
        assert seen == [("ok", 1)]
        assert stash == [("p", ("ok", 2)), ("p", ("ok", 3))]
    finally:
        link.close()



def test_the_compiled_link_takes_compiled_rings_only(twin):
    from ray_lite._fast import _ring_py
    link_impl = twin.module("link")
    tx = _ring_py.ShmRing.create(SMALL, side="producer")
    rx = _ring_py.ShmRing.attach(tx.name, side="consumer")
    try:
        if twin.compiled:
            with pytest.raises(TypeError):
                link_impl.Link((tx.name, tx.name), tx, rx)
        else:
            link = link_impl.Link((tx.name, tx.name), tx, rx)
            link.send(("pure", 1))
            assert link.recv_all() == [("pure", 1)]
    finally:
        tx.close()
        rx.close()
