"""Shared helpers of the Serve tests (HTTP over loopback, raw sockets)."""
import http.client as _httpc
import socket


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

