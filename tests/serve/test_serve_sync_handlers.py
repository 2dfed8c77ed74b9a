"""Synchronous handlers: one that took long runs on the replica's user-code
thread from then on, so that the replica's event loop keeps serving (its
other requests, its health checks, its listener); a quick one runs on the
loop."""
import socket
import threading
import time

from ray_lite import serve

from serve_helpers import http

T = 30


def _burn(ms):
    end = time.thread_time() + ms / 1000.0     # CPU, not a sleep: the handler's own work
    while time.thread_time() < end:
        pass


def _wait_at(door_port):
    """Block until the test's door (a listening socket) sends a byte."""
    with socket.create_connection(("127.0.0.1", door_port), timeout=T) as s:
        s.recv(1)


@serve.deployment(max_ongoing_requests=4)
class Mixed:
    def __call__(self, request):
        q = request.query_params
        _burn(float(q.get("burn_ms", "0")))
        if "door" in q:
            _wait_at(int(q["door"]))
        return threading.current_thread().name

    def work(self, burn_ms=0.0, door=None):
        _burn(burn_ms)
        if door is not None:
            _wait_at(door)
        return threading.current_thread().name

    async def loop_thread(self):
        return threading.current_thread().name


class _Door:
    """A socket the handler connects to and waits at until ``open()``."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(T)
        self.port = self.server.getsockname()[1]
        self.conn = None

    def wait_for_handler(self):
        self.conn, _ = self.server.accept()

    def open(self):
        self.conn.sendall(b"x")
        self.conn.close()
        self.server.close()


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def test_a_slow_synchronous_http_handler_leaves_the_loop_free(serve_port):
    handle = serve.run(Mixed.bind())
    loop_thread = handle.loop_thread.remote().result(timeout_s=T)
    # Quick: on the loop.
    assert http(serve_port, "GET", "/")[2].decode() == loop_thread
    # It took long (10 ms, over the 2 ms default): the next one runs apart.
    assert http(serve_port, "GET", "/?burn_ms=10")[2].decode() == loop_thread
    door = _Door()
    t, out = _in_thread(lambda: http(serve_port, "GET", f"/?door={door.port}"))
    door.wait_for_handler()
    try:
        # While it waits, the replica's loop answers.
        assert handle.loop_thread.remote().result(timeout_s=T) == loop_thread
    finally:
        door.open()
    t.join(T)
    status, _, body = out[0]
    assert status == 200 and body.decode().startswith("serve-user-code")
    # One that runs quick there brings the handler back to the loop.
    assert http(serve_port, "GET", "/")[2].decode().startswith("serve-user-code")
    assert http(serve_port, "GET", "/")[2].decode() == loop_thread


def test_a_slow_synchronous_method_leaves_the_loop_free(serve_runtime):
    handle = serve.run(Mixed.bind(), route_prefix=None)
    loop_thread = handle.loop_thread.remote().result(timeout_s=T)
    assert handle.work.remote(burn_ms=10).result(timeout_s=T) == loop_thread
    door = _Door()
    response = handle.work.remote(door=door.port)
    door.wait_for_handler()
    try:
        assert handle.loop_thread.remote().result(timeout_s=T) == loop_thread
    finally:
        door.open()
    assert response.result(timeout_s=T).startswith("serve-user-code")
    assert handle.work.remote().result(timeout_s=T).startswith("serve-user-code")
    assert handle.work.remote().result(timeout_s=T) == loop_thread
