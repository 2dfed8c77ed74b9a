"""Shared helpers of the Serve tests (HTTP over loopback, raw sockets)."""
import asyncio
import http.client as _httpc
import os
import selectors
import socket
import time
import urllib.request


def http(port, method, path, body=None, headers=None, timeout=30):
    """(status, headers dict, body bytes) of one request on a fresh connection."""
    conn = _httpc.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def raw(port, data, timeout=30):
    """Send ``data`` on a raw socket; everything the server sends until it closes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk
    finally:
        s.close()



def process_gone(pid):
    """True once ``pid`` has exited (gone, or a zombie its parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def wait_until(cond, what, timeout=60):
    """Poll ``cond`` until true, ``timeout`` seconds at most.  It only polls
    (drives no links of this process), so a handle's view of the replicas
    stays as stale as a real idle one's."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape_metrics(port):
    """The samples served on ``port``'s /metrics: name -> [(labels, value)]."""
    from prometheus_client.parser import text_string_to_metric_families
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def metric_value(samples, name, **labels):
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for lab, v in samples.get(name, ())
               if all(lab.get(k) == want for k, want in labels.items()))


def serve_pids():
    """Serve's processes: ``{"proxies": [pid], "replicas": {"app/dep": [pid]}, ...}``."""
    from ray_lite.serve import _core, context
    return _core.get(context.get_controller().process_ids.remote(), timeout=30)


def _socket_inodes(pid):
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _server_inode(server_port, client_port):
    """The inode of the server's end of the loopback connection from ``client_port``."""
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == server_port and \
                    int(fields[2].split(":")[1], 16) == client_port:
                return int(fields[9])
    return None


def connection_to(port, pid, tries=200):
    """A socket to ``port`` that process ``pid`` accepted.

    With direct ingress the proxy and the ingress replicas all listen on
    ``port`` and the kernel spreads new connections over them: connect
    until one lands in ``pid``."""
    for _ in range(tries):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        try:
            client_port = s.getsockname()[1]
            # Until accepted, the server's end has no inode (0); it is gone
            # (None) when a listener closed with it in its queue.
            inode = []
            wait_until(lambda: inode.append(_server_inode(port, client_port)) or
                       inode[-1] != 0, "a listener to accept the connection", timeout=30)
            if inode[-1] is not None and inode[-1] in _socket_inodes(pid):
                return s
        except BaseException:
            s.close()
            raise
        s.close()
    raise AssertionError(f"none of {tries} connections landed in {pid}")


def listens(pid, port):
    """Whether process ``pid`` holds a socket listening on ``port`` (IPv4)."""
    with open("/proc/net/tcp") as f:
        next(f)
        rows = [line.split() for line in f]
    inodes = {int(r[9]) for r in rows if r[3] == "0A" and int(r[1].split(":")[1], 16) == port}
    try:
        return bool(inodes & _socket_inodes(pid))
    except OSError:
        return False        # gone


def refused_and_waiting(a, b, timeout=30):
    """Of two connections whose requests were sent to a full queue of one,
    ``(the one answered first, the other)``: exactly one is answered (the
    refusal) within ``timeout`` seconds while the other waits."""
    with selectors.DefaultSelector() as sel:
        sel.register(a, selectors.EVENT_READ)
        sel.register(b, selectors.EVENT_READ)
        ready = sel.select(timeout)
    assert len(ready) == 1, "exactly one of the two waiting requests is refused"
    refused = ready[0][0].fileobj
    return refused, (b if refused is a else a)


class _PinnedRoutes:
    """A proxy's ``listen_routes``: the routes it was made with, then never a
    change (the controller's replacement of a dead replica never arrives)."""

    def __init__(self, routes):
        self.routes = routes

    def remote(self, index, known_version):
        return self._answer(known_version)

    async def _answer(self, known_version):
        if known_version < 0:
            return 0, self.routes, True
        await asyncio.get_running_loop().create_future()


class PinnedController:
    """What a proxy needs of the controller: routes that never change (a
    test's own proxy, beside Serve's, made from ``listen_routes(0, -1)``)."""

    def __init__(self, routes):
        self.listen_routes = _PinnedRoutes(routes)
