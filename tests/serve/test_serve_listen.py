"""A listening socket that leaves the port's listeners while others stay
resets no connection: it takes no SYN once its owner stops accepting."""
import socket
import sys

import pytest

from ray_lite.serve import _listen
from ray_lite.serve._listen import refuse_syns, shared_socket, take_syns

from serve_helpers import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux filters")


@pytest.fixture
def group():
    """Two sockets listening on one loopback port (SO_REUSEPORT), and the port."""
    a = shared_socket(socket.AF_INET, "127.0.0.1", 0)
    port = a.getsockname()[1]
    b = shared_socket(socket.AF_INET, "127.0.0.1", port)
    a.listen(64)
    b.listen(64)
    yield a, b, port
    a.close()
    b.close()


def _accept_all(sock):
    taken = []
    while True:
        try:
            taken.append(sock.accept()[0])
        except BlockingIOError:
            return taken


def _kernel_migrates():
    return _listen._kernel_migrates()


def test_a_refusing_socket_starts_no_connection_and_its_clients_land_on_another(group):
    a, b, port = group
    if _kernel_migrates():
        pytest.skip("the kernel moves a closing listener's connections itself")
    assert refuse_syns(a)
    clients = []
    try:
        for _ in range(16):     # the port's hash sends about half to a
            c = socket.socket()
            c.setblocking(False)
            assert c.connect_ex(("127.0.0.1", port)) in (0, 115)     # EINPROGRESS
            clients.append(c)
        assert _accept_all(a) == []
        a.close()
        # Those whose SYN a dropped send it again (a second later) to b.
        served = []
        wait_until(lambda: served.extend(_accept_all(b)) or len(served) == 16,
                   "every client to be accepted by the socket left", timeout=20)
        for conn in served:
            conn.close()
        for c in clients:
            assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0   # never reset
    finally:
        for c in clients:
            c.close()


def test_a_connection_queued_before_the_refusal_is_still_taken(group):
    a, b, port = group
    b.close()           # a alone: the connection queues on it
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        refuse_syns(a)
        (conn,) = _accept_all(a)
        with conn:
            c.sendall(b"x")
            assert conn.recv(1) == b"x"


def test_a_socket_that_takes_syns_again_starts_connections(group):
    a, b, port = group
    b.close()
    refuse_syns(a)
    take_syns(a)
    take_syns(a)        # (none attached: no error)
    taken = []
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        wait_until(lambda: taken.extend(_accept_all(a)) or len(taken) == 1,
                   "the connection to be accepted", 5)
    taken[0].close()
