"""Shared helpers of the Serve tests (HTTP over loopback, raw sockets)."""
import http.client as _httpc
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
