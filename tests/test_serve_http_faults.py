"""The HTTP server under what clients do wrong or leave undone: HTTP/1.0
keep-alive, upgrade requests it does not serve, and idle keep-alive
connections (issue 14)."""
import socket

from starlette.requests import Request

from ray_lite import serve

from serve_helpers import raw


@serve.deployment
def hello(request: Request):
    return "hello"


def _one_answer(s):
    """One response read from ``s``: (head, body); a body of content-length bytes."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"the server closed the connection; got {buf!r}"
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, "the server closed the connection mid-body"
        body += chunk
    assert len(body) == length, "more bytes than one answer"
    return head.lower(), body


def test_http10_keep_alive_is_said_in_the_answer_and_kept(serve_port):
    serve.run(hello.bind())
    with socket.create_connection(("127.0.0.1", serve_port), timeout=30) as s:
        for _ in range(2):
            s.sendall(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            head, body = _one_answer(s)
            assert body == b"hello"
            # Without it an HTTP/1.0 client takes the answer to end with the
            # connection, and waits (ab -k stalls).
            assert b"\r\nconnection: keep-alive" in head
    # Plain HTTP/1.0: the connection ends with the answer, and says so.
    out = raw(serve_port, b"GET / HTTP/1.0\r\n\r\n")
    assert out.endswith(b"hello") and b"connection: close" in out.lower()


def test_upgrade_and_connect_get_one_answer_then_the_connection_ends(serve_port):
    serve.run(hello.bind())
    for request in (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                    b"Upgrade: websocket\r\n\r\n",
                    b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                    b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
                    b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"):
        out = raw(serve_port, request)
        assert out.count(b"HTTP/1.1 ") == 1, out
        assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"hello"), out
        assert b"connection: close" in out.lower()


def test_idle_keep_alive_connections_are_closed_after_the_timeout(serve_runtime):
    from ray_lite.serve.api import _http_port
    serve.start(http_options={"port": 0, "proxies": 1, "keep_alive_timeout_s": 0.3})
    port = _http_port()
    serve.run(hello.bind())
    with socket.create_connection(("127.0.0.1", port), timeout=30) as used, \
            socket.create_connection(("127.0.0.1", port), timeout=30) as unused:
        used.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _one_answer(used)[1] == b"hello"
        # Both idle now: the server ends them (a read sees the end, not the
        # 30 s socket timeout).
        assert used.recv(65536) == b""
        assert unused.recv(65536) == b""
