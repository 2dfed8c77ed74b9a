"""What a proxy holds after many requests: bounded, however many it served.

The soak (``ray-lite bench soak``) saw a proxy's resident memory grow by
~1.4 MB/s under load: the shared pages of its rings to the replicas, each
lap of a ring touching the next of its 256 pages.  A ring whose consumer
keeps up now stays in its first pages (``_ring_py.HOT_BYTES``); these tests
count those pages (``RssShmem``: pages, not timings) across thousands of
requests."""
import socket

from starlette.requests import Request

from ray_lite import serve
from ray_lite.serve import context
from ray_lite.serve._core import get

BATCH = 50


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0})
def hi(request: Request):
    return "hi"


def _proxy_shared_kb():
    pid, = get(context.get_controller().process_ids.remote())["proxies"]
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssShmem:"))


def _requests(port, n):
    """``n`` keep-alive requests, pipelined ``BATCH`` at a time, on one connection."""
    request = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for _ in range(n // BATCH):
            s.sendall(request * BATCH)
            got = b""
            while got.count(b"\r\n\r\nhi") < BATCH:
                chunk = s.recv(65536)
                assert chunk, "the proxy closed the connection"
                got += chunk
            assert got.count(b"HTTP/1.1 200 OK") == BATCH


def test_a_busy_proxy_touches_a_bounded_number_of_shared_pages(serve_port):
    serve.run(hi.bind())
    _requests(serve_port, 500)          # warm-up: the links are open, the code paths run
    before = _proxy_shared_kb()
    _requests(serve_port, 8000)         # ~2 MB each way: each ring lapped without the bound
    grown = _proxy_shared_kb() - before
    # 2 replicas x 2 rings x HOT_BYTES (64 kB) at most; without the bound, ~4 MB.
    assert grown < 1024, f"the proxy's shared pages grew by {grown} kB"
