"""The other process of the ring tests.

``Peer(twin)`` starts ``python ring_peer.py <twin>`` and talks to it over its
stdin/stdout with length-prefixed pickles: ``peer.call(op, *args)`` sends a
request and returns the reply (raising ``PeerError`` with the remote traceback
if the operation failed).  Every wait is bounded and the child is always
ended by PID (``Peer`` is a context manager; leaving it kills what is still
running and reaps it).

Operations (run in the child, in order, on rings it keeps by name):
``create(capacity, side)`` -> name; ``attach(name, side)``;
``send(name, messages)`` with ``messages`` a list of ``("bytes", data)`` /
``("value", obj)`` items; ``recv(name, count)`` -> list; ``close(name)``;
``put_big(name, nbytes)`` (a message that needs a side segment);
``fill(name)`` -> number of messages put before the ring was full;
``block(name, how)`` replies ``"blocking"`` then blocks in ``get`` / ``put``
(how = "get" | "put") and finally replies with the exception's class name.
"""
import importlib
import os
import pickle
import select
import signal
import subprocess
import sys
import traceback


class PeerError(Exception):
    """An operation failed in the peer process (message: its traceback)."""


def _ray_lite_root():
    import ray_lite
    return os.path.dirname(os.path.dirname(os.path.abspath(ray_lite.__file__)))


def _write_frame(stream, obj):
    data = pickle.dumps(obj)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


def _read_exact(fd, n, deadline):
    import time
    chunks = []
    while n:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise TimeoutError("the ring peer did not answer in time")
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError("the ring peer exited")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class Peer:
    """A child process running this file's command loop with the given twin
    (``"compiled"`` or ``"python"``, or a ``Twin`` of conftest)."""

    def __init__(self, twin, timeout=60.0):
        self.timeout = timeout
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_ray_lite_root(), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(twin)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.pid = self.proc.pid

    def send(self, op, *args):
        _write_frame(self.proc.stdin, (op,) + args)

    def recv(self, timeout=None):
        import time
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        fd = self.proc.stdout.fileno()
        n = int.from_bytes(_read_exact(fd, 8, deadline), "little")
        ok, value = pickle.loads(_read_exact(fd, n, deadline))
        if not ok:
            raise PeerError(value)
        return value

    def call(self, op, *args, timeout=None):
        self.send(op, *args)
        return self.recv(timeout)

    def kill(self):
        """SIGKILL the child and reap it."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(self.timeout)

    def close(self):
        """Let the child exit (end of its input), killing it if it does not."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(self.timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            self.kill()
        self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------------ the child ---
def _serve(twin):
    mod = importlib.import_module(
        "ray_lite._fast._ring_c" if twin == "compiled" else "ray_lite._fast._ring_py")
    rings = {}
    out = sys.stdout.buffer
    inp = sys.stdin.buffer

    def reply(value, ok=True):
        _write_frame(out, (ok, value))

    def op_create(capacity, side):
        ring = mod.ShmRing.create(capacity, side=side)
        rings[ring.name] = ring
        return ring.name

    def op_attach(name, side):
        rings[name] = mod.ShmRing.attach(name, side=side)
        return rings[name].peer_pid

    def op_send(name, messages):
        ring = rings[name]
        for kind, payload in messages:
            if kind == "bytes":
                ring.put_bytes(payload, timeout=60)
            else:
                ring.put(payload, timeout=60)
        return len(messages)

    def op_recv(name, count):
        return [rings[name].get(timeout=60) for _ in range(count)]

    def op_close(name):
        rings.pop(name).close()

    def op_put_big(name, nbytes):
        rings[name].put_bytes(os.urandom(nbytes), timeout=60)

    def op_fill(name):
        ring = rings[name]
        n = 0
        try:
            while True:
                ring.put_bytes(b"f" * 100, timeout=0)
                n += 1
        except TimeoutError:
            return n

    def op_block(name, how):
        ring = rings[name]
        reply("blocking")
        try:
            if how == "get":
                ring.get(timeout=120)
            else:
                ring.put_bytes(b"x" * 100, timeout=120)
        except Exception as exc:
            return type(exc).__name__
        return "returned"

    ops = {name[3:]: fn for name, fn in locals().items() if name.startswith("op_")}
    while True:
        header = inp.read(8)
        if len(header) < 8:
            break
        op, *args = pickle.loads(inp.read(int.from_bytes(header, "little")))
        try:
            result = ops[op](*args)
        except Exception:
            reply(traceback.format_exc(), ok=False)
        else:
            reply(result)
    for ring in rings.values():
        ring.close()


if __name__ == "__main__":
    _serve(sys.argv[1])
