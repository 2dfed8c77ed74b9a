"""Entry points of the benchmark's child processes (spawned: each runs in a
fresh interpreter, so it must be importable by module path).

Every wait here is bounded: a parent that vanishes makes the ring calls raise
(``PeerDiedError``/``ChannelClosedError``) or times them out, and the child
exits instead of lingering.
"""
import importlib
import resource
import struct
import time

# How long a child waits for any single message before giving up.
CHILD_TIMEOUT_S = 60.0

STOP = b""
READY = b"ready"

_WAKE = struct.Struct("<q")                 # parent's CLOCK_MONOTONIC ns at put
_WAKE_REPLY = struct.Struct("<qqq")        # child CPU ns during the wait, wall ns of the wait, wake-up ns


def _attach(ring_module, to_child, to_parent):
    mod = importlib.import_module(ring_module)
    rin = mod.ShmRing.attach(to_child, side="consumer")
    try:
        rout = mod.ShmRing.attach(to_parent, side="producer")
    except BaseException:
        rin.close()
        raise
    return mod, rin, rout


def ring_echo(ring_module, to_child, to_parent):
    """Echo every message back until an empty one (or the parent closes)."""
    mod, rin, rout = _attach(ring_module, to_child, to_parent)
    try:
        rout.put_bytes(READY, timeout=CHILD_TIMEOUT_S)
        get, put = rin.get, rout.put_bytes
        while True:
            msg = get(timeout=CHILD_TIMEOUT_S)
            if msg == STOP:
                break
            put(msg, timeout=CHILD_TIMEOUT_S)
    except mod.ChannelClosedError:
        pass
    finally:
        rin.close()
        rout.close()


def pipe_echo(conn):
    """The anchor's echo child (as in shared/anchors/ipc_rtt.py)."""
    try:
        while True:
            msg = conn.recv_bytes()
            if msg == STOP:
                break
            conn.send_bytes(msg)
    except EOFError:
        pass
    finally:
        conn.close()


def cpu_ns():
    # The whole process (every thread): a waiter that hid a spinning helper
    # thread must be charged for it.
    r = resource.getrusage(resource.RUSAGE_SELF)
    return int((r.ru_utime + r.ru_stime) * 1e9)


def timed_block(receive):
    """``receive()``, timed as B5 needs it: ``(its value, the CPU ns this
    process burnt while blocked, the wall ns of the wait, CLOCK_MONOTONIC ns
    at return)``, the last to subtract the sender's clock from."""
    clock = time.clock_gettime_ns
    mono = time.CLOCK_MONOTONIC
    cpu0 = cpu_ns()
    wall0 = clock(mono)
    value = receive()
    woke = clock(mono)
    return value, cpu_ns() - cpu0, woke - wall0, woke


def ring_idle_waiter(ring_module, to_child, to_parent, rounds):
    """``rounds`` times: block in ``get`` on the empty ring until the parent
    sends its CLOCK_MONOTONIC time, then reply with the CPU time this process
    burnt while blocked, the wall time of the wait and the wake-up latency
    (our clock at return from ``get`` minus the parent's at ``put``; one
    clock, CLOCK_MONOTONIC, for both processes)."""
    mod, rin, rout = _attach(ring_module, to_child, to_parent)
    try:
        rout.put_bytes(READY, timeout=CHILD_TIMEOUT_S)
        for _ in range(rounds):
            msg, cpu, wall, woke = timed_block(lambda: rin.get(timeout=CHILD_TIMEOUT_S))
            if msg == STOP:
                break
            (put_at,) = _WAKE.unpack(msg)
            rout.put_bytes(_WAKE_REPLY.pack(cpu, wall, woke - put_at), timeout=CHILD_TIMEOUT_S)
    except mod.ChannelClosedError:
        pass
    finally:
        rin.close()
        rout.close()
