"""Wake-ups held to the end of a loop's turn (``hold_wakes``/``release_wakes``),
both twins: a held put leaves a sleeping consumer asleep until the release,
and nothing in this process can wait on a wake-up it holds."""
import asyncio
import select
import threading

import pytest

SMALL = 4096
BOUND_S = 30.0      # what a test waits at most for what must happen


@pytest.fixture
def held(ring_impl):
    """``ring_impl``; wake-ups not held at the end, whatever the test did."""
    yield ring_impl
    ring_impl.hold_wakes(None)


def readable(fd, timeout=0.0):
    return bool(select.select([fd], [], [], timeout)[0])


def drain(consumer):
    out = []
    while consumer.poll():
        out.append(consumer.get_nowait())
    return out


def test_a_held_put_wakes_its_sleeping_consumer_only_at_the_release(held, pair):
    producer, consumer = pair
    scheduled = []
    held.hold_wakes(lambda: scheduled.append(1))
    assert consumer.arm_fd()        # the consumer goes to sleep on its descriptor
    producer.put("a")
    producer.put("b")
    assert consumer.poll()          # the messages are there at once...
    assert not readable(consumer.fileno())     # ...but the sleeper was not woken
    assert scheduled == [1]         # one release asked for, not one per put
    held.release_wakes()
    assert readable(consumer.fileno())
    consumer.clear_fd()
    assert drain(consumer) == ["a", "b"]
    # The next held put asks for the next release.
    assert consumer.arm_fd()
    producer.put_bytes(b"c")
    assert scheduled == [1, 1]
    assert not readable(consumer.fileno())
    held.release_wakes()
    assert readable(consumer.fileno())
    consumer.clear_fd()
    assert drain(consumer) == [b"c"]


def test_puts_from_another_thread_wake_at_once(held, pair):
    producer, consumer = pair
    held.hold_wakes(lambda: None)
    assert consumer.arm_fd()
    t = threading.Thread(target=producer.put, args=("x",))
    t.start()
    t.join(BOUND_S)
    assert not t.is_alive()
    assert readable(consumer.fileno(), BOUND_S)
    consumer.clear_fd()
    assert drain(consumer) == ["x"]


def test_only_one_thread_holds(held):
    held.hold_wakes(lambda: None)
    held.hold_wakes(lambda: None)       # the holder again: fine
    errors = []

    def other():
        try:
            held.hold_wakes(lambda: None)
        except RuntimeError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=other)
    t.start()
    t.join(BOUND_S)
    assert errors and "another thread" in errors[0]


def test_stopping_releases_and_later_puts_wake_at_once(held, pair):
    producer, consumer = pair
    held.hold_wakes(lambda: None)
    assert consumer.arm_fd()
    producer.put(1)
    assert not readable(consumer.fileno())
    held.hold_wakes(None)
    assert readable(consumer.fileno())
    consumer.clear_fd()
    assert consumer.arm_fd() is False   # (the message is there: no sleep)
    assert drain(consumer) == [1]
    assert consumer.arm_fd()
    producer.put(2)
    assert readable(consumer.fileno())
    consumer.clear_fd()
    assert drain(consumer) == [2]


def test_a_schedule_that_fails_gives_the_wake_at_once(held, pair):
    producer, consumer = pair

    def closed_loop():
        raise RuntimeError("Event loop is closed")

    held.hold_wakes(closed_loop)
    assert consumer.arm_fd()
    producer.put("sent")        # no error: the message went, and so did the wake-up
    assert readable(consumer.fileno())
    consumer.clear_fd()
    assert drain(consumer) == ["sent"]


def test_a_ring_closed_while_it_owes_a_wake_is_passed_over(held):
    producer = held.ShmRing.create(SMALL, side="producer")
    consumer = held.ShmRing.attach(producer.name, side="consumer")
    held.hold_wakes(lambda: None)
    assert consumer.arm_fd()
    producer.put("last")
    producer.close()
    consumer.close()
    held.release_wakes()        # nothing to wake, no error


def _sleeping_echo(consumer, reply_to, count):
    """A consumer thread that sleeps on its descriptor (never on a helper of
    ours, which would give held wake-ups itself) and answers each message."""
    def run():
        got = 0
        while got < count:
            if consumer.arm_fd():
                readable(consumer.fileno(), BOUND_S)
            consumer.clear_fd()
            for m in drain(consumer):
                got += 1
                if reply_to is not None:
                    reply_to.put(m)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_full_ring_gives_its_held_wake_before_it_waits(held):
    producer = held.ShmRing.create(SMALL, side="producer")
    consumer = held.ShmRing.attach(producer.name, side="consumer")
    try:
        count = 200     # 200 x 64 bytes: several times the ring
        t = _sleeping_echo(consumer, None, count)
        held.hold_wakes(lambda: None)   # no release of its own comes
        for i in range(count):
            # Without the wake-up before the wait, the consumer sleeps on
            # and the full ring times this put out.
            producer.put(b"%060d" % i, timeout=BOUND_S / 3)
        held.release_wakes()
        t.join(BOUND_S)
        assert not t.is_alive()
    finally:
        producer.close()
        consumer.close()


def test_a_wait_on_the_holding_thread_gives_the_held_wakes_first(held):
    requests = held.ShmRing.create(SMALL, side="producer")
    requests_in = held.ShmRing.attach(requests.name, side="consumer")
    replies_out = held.ShmRing.create(SMALL, side="producer")
    replies = held.ShmRing.attach(replies_out.name, side="consumer")
    try:
        t = _sleeping_echo(requests_in, replies_out, 1)
        held.hold_wakes(lambda: None)
        requests.put("ping")
        # The echo sleeps until the held wake-up is given: this get must
        # give it before it waits, or it times out.
        assert replies.get(timeout=BOUND_S / 3) == "ping"
        t.join(BOUND_S)
        assert not t.is_alive()
    finally:
        for r in (requests, requests_in, replies_out, replies):
            r.close()


def test_an_event_loop_gives_its_turns_wakes_after_the_turn(held, pair):
    producer, consumer = pair

    async def main():
        loop = asyncio.get_running_loop()
        release = held.release_wakes
        held.hold_wakes(lambda: loop.call_soon(release))
        assert consumer.arm_fd()
        for i in range(3):
            producer.put(i)
        assert not readable(consumer.fileno())      # still this turn
        await asyncio.sleep(0)                       # the release's turn
        assert readable(consumer.fileno())

    asyncio.run(main())
    consumer.clear_fd()
    assert drain(consumer) == [0, 1, 2]
