"""WebSockets through the HTTP proxy (and with direct ingress) to an
``@serve.ingress`` app (issue 12): echo with a real client, close codes both
ways, subprotocols, a route without a websocket (403), a replica that dies
(1011), and a deployment without an ASGI app (answered as plain HTTP)."""
import asyncio
import importlib.util
import os
import signal

import pytest

from serve_helpers import connection_to, http, process_gone, raw, serve_pids, wait_until

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("websockets", "wsproto", "starlette")),
    reason="websockets, wsproto or starlette is not installed")

# Each test that takes serve_port (or serve_http_mode) runs through the
# proxies and with direct ingress (conftest).
SERVE_HTTP_MODES = ("proxies", "direct")


def _starlette_app():
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocketDisconnect

    disconnects = []      # the codes of the clients' closes this replica saw

    async def echo(ws):
        await ws.accept(subprotocol=(ws.scope["subprotocols"] or [None])[0])
        try:
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    disconnects.append(msg["code"])
                    return
                if msg.get("text") == "disconnects":
                    await ws.send_text(",".join(map(str, disconnects)))
                    continue
                if msg.get("text") == "close-4001":
                    await ws.close(code=4001, reason="asked")
                    return
                if msg.get("text") == "pid":
                    await ws.send_text(str(os.getpid()))
                elif msg.get("text") is not None:
                    await ws.send_text("echo:" + msg["text"])
                else:
                    await ws.send_bytes(msg["bytes"][::-1])
        except WebSocketDisconnect:
            return

    async def refuse(ws):
        await ws.close()

    return Starlette(routes=[WebSocketRoute("/ws", echo), WebSocketRoute("/refuse", refuse)])


def _deploy(**options):
    from ray_lite import serve

    @serve.deployment(**options)
    @serve.ingress(_starlette_app())
    class Sockets:
        pass

    serve.run(Sockets.bind(), route_prefix="/app")


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_echo_text_and_bytes_and_close_from_the_client(serve_port):
    import websockets
    _deploy()

    async def talk():
        async with websockets.connect(f"ws://127.0.0.1:{serve_port}/app/ws",
                                      subprotocols=["chat"]) as ws:
            assert ws.subprotocol == "chat"
            out = []
            for i in range(20):
                await ws.send(f"m{i}")
                out.append(await ws.recv())
            await ws.send(b"\x01\x02\x03")
            out.append(await ws.recv())
            big = "x" * 300_000      # several frames' worth, one message
            await ws.send(big)
            assert await ws.recv() == "echo:" + big
            return out
    out = _run(talk())
    assert out == [f"echo:m{i}" for i in range(20)] + [b"\x03\x02\x01"]
    # The connection's replica slot came back: plain HTTP still goes through.
    assert http(serve_port, "GET", "/-/healthz")[0] == 200


def test_close_from_the_app_reaches_the_client_with_its_code(serve_port):
    import websockets
    _deploy()

    async def talk():
        async with websockets.connect(f"ws://127.0.0.1:{serve_port}/app/ws") as ws:
            await ws.send("close-4001")
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            return ws.close_code, ws.close_reason
    assert _run(talk()) == (4001, "asked")


def test_a_path_without_a_websocket_route_is_refused_with_403(serve_port):
    import websockets
    _deploy()

    async def connect(path):
        with pytest.raises(websockets.InvalidStatus) as info:
            async with websockets.connect(f"ws://127.0.0.1:{serve_port}{path}"):
                pass
        return info.value.response.status_code
    assert _run(connect("/app/refuse")) == 403
    assert _run(connect("/app/nowhere")) == 403     # Starlette's answer for no route
    assert _run(connect("/elsewhere")) == 404       # no application there


def test_a_replica_that_dies_closes_the_socket_with_1011(serve_port, serve_http_mode):
    """A WebSocket the proxy relays gets 1011 when its replica dies.  With
    direct ingress, one whose connection the dying replica accepted itself
    ends with it, with no close frame (1006 to the client)."""
    import websockets
    _deploy()

    async def talk(sock, holder=None):
        async with websockets.connect(f"ws://127.0.0.1:{serve_port}/app/ws", sock=sock) as ws:
            await ws.send("pid")
            pid = int(await ws.recv())
            if holder is not None:
                assert pid == holder        # a replica runs what it accepts itself
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            return ws.close_code
    pids = serve_pids()
    (proxy,) = pids["proxies"]
    if serve_http_mode == "direct":
        (replica,) = pids["replicas"]["default/Sockets"]
        assert _run(talk(connection_to(serve_port, replica), holder=replica)) == 1006
        wait_until(lambda: process_gone(replica), "the killed replica's end")

        def proxy_knows_the_replacement():
            # The app's answer to plain HTTP on a WebSocket path (404), not
            # the proxy's 503 while it knows no replica.
            with connection_to(serve_port, proxy) as s:
                s.sendall(b"GET /app/ws HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                return s.recv(65536).startswith(b"HTTP/1.1 404 ")
        wait_until(proxy_knows_the_replacement, "the proxy to route to the replacement")
    assert _run(talk(connection_to(serve_port, proxy))) == 1011


def test_a_bad_handshake_is_answered_as_plain_http_then_the_connection_ends(serve_port):
    _deploy()
    base = (b"GET /app/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\n")
    for rest in (b"Sec-WebSocket-Version: 13\r\n\r\n",           # no key
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"Sec-WebSocket-Version: 8\r\n\r\n"):             # not RFC 6455's
        out = raw(serve_port, base + rest)
        # Starlette's answer to HTTP on a websocket-only path; no 101.
        assert out.startswith(b"HTTP/1.1 404 "), out
        assert out.count(b"HTTP/1.1") == 1


def test_a_deployment_without_an_asgi_app_answers_upgrades_as_plain_http(serve_port):
    from starlette.requests import Request

    from ray_lite import serve

    @serve.deployment
    def hello(request: Request):
        return "hello"

    serve.run(hello.bind())
    out = raw(serve_port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                          b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 ") and out.endswith(b"hello")
    assert out.count(b"HTTP/1.1") == 1


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="fastapi is not installed")
def test_fastapi_websocket_routes_in_the_class_and_at_module_level(serve_port):
    import websockets
    from fastapi import FastAPI, WebSocket

    from ray_lite import serve

    app = FastAPI()

    @app.websocket("/module")
    async def module_level(websocket: WebSocket):
        await websocket.accept()
        await websocket.send_text("module:" + await websocket.receive_text())
        await websocket.close()

    @serve.deployment
    @serve.ingress(app)
    class Chat:
        def __init__(self):
            self.greeting = "hello"

        @app.websocket("/chat/{room}")
        async def chat(self, websocket: WebSocket, room: str):
            await websocket.accept()
            async for text in websocket.iter_text():
                await websocket.send_text(f"{self.greeting} {room}: {text}")

    serve.run(Chat.bind(), route_prefix="/f")

    async def talk():
        async with websockets.connect(f"ws://127.0.0.1:{serve_port}/f/chat/lobby") as ws:
            await ws.send("hi")
            first = await ws.recv()
        async with websockets.connect(f"ws://127.0.0.1:{serve_port}/f/module") as ws:
            await ws.send("x")
            second = await ws.recv()
            with pytest.raises(websockets.ConnectionClosedOK):
                await ws.recv()
        return first, second
    assert _run(talk()) == ("hello lobby: hi", "module:x")


def test_a_close_from_the_client_reaches_the_app_with_its_code(serve_port):
    import websockets
    _deploy()

    async def talk():
        async with websockets.connect(f"ws://127.0.0.1:{serve_port}/app/ws") as ws:
            await ws.send("a")
            await ws.recv()
            await ws.close(code=4321)
        seen = ""
        for _ in range(200):     # the first socket's disconnect reaches the app in its time
            async with websockets.connect(f"ws://127.0.0.1:{serve_port}/app/ws") as ws:
                await ws.send("disconnects")
                seen = await ws.recv()
            if "4321" in seen:
                break
            await asyncio.sleep(0.05)
        return seen
    assert _run(talk()).split(",")[0] == "4321"


def test_a_flood_from_the_client_to_a_slow_app_arrives_whole_and_in_order(serve_port):
    """The proxy stops reading from a client whose app has not taken what
    came (the replica answers its calls only when there is room): nothing
    is lost or reordered on the way."""
    import websockets
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute

    from ray_lite import serve

    async def slow_sum(ws):
        await ws.accept()
        got = []
        while len(got) < 500:
            got.append(int(await ws.receive_text()))
            if len(got) % 50 == 0:
                await asyncio.sleep(0)      # lets the proxy's calls queue up
        await ws.send_text("ok" if got == list(range(500)) else f"bad {got[:10]}")
        await ws.close()

    @serve.deployment
    @serve.ingress(Starlette(routes=[WebSocketRoute("/", slow_sum)]))
    class Slow:
        pass

    serve.run(Slow.bind())

    async def talk():
        async with websockets.connect(f"ws://127.0.0.1:{serve_port}/") as ws:
            for i in range(500):
                await ws.send(str(i))
            return await ws.recv()
    assert _run(talk()) == "ok"


def test_a_websocket_to_a_deployment_scaled_to_zero_waits_for_its_replica(serve_port):
    import websockets
    from ray_lite import serve
    _deploy(autoscaling_config={"min_replicas": 0, "max_replicas": 1,
                                "metrics_interval_s": 0.1, "look_back_period_s": 0.3,
                                "downscale_delay_s": 600})
    deps = serve.status().applications["default"].deployments
    assert deps["Sockets"].replica_states == {}

    async def talk():
        async with websockets.connect(f"ws://127.0.0.1:{serve_port}/app/ws") as ws:
            await ws.send("cold")
            return await ws.recv()
    assert _run(talk()) == "echo:cold"
    deps = serve.status().applications["default"].deployments
    assert deps["Sockets"].replica_states == {"RUNNING": 1}


# ------------------------------------------ a client that breaks RFC 6455
_UPGRADE = (b"GET /app/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")


def _frame(opcode, payload=b"", fin=True, mask=True, rsv=0, length=None):
    """One frame as a client sends it (masked unless told), RFC 6455 5.2."""
    n = len(payload) if length is None else length
    first = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    m = 0x80 if mask else 0
    if n < 126:
        head = first + bytes([m | n])
    elif n < 1 << 16:
        head = first + bytes([m | 126]) + n.to_bytes(2, "big")
    else:
        head = first + bytes([m | 127]) + n.to_bytes(8, "big")
    if mask:
        key = b"\x0f\x1e\x2d\x3c"
        head += key
        payload = bytes(c ^ key[i % 4] for i, c in enumerate(payload))
    return head + payload


def _close_frame_after(port, frames):
    """Open a WebSocket on a raw socket, send ``frames``; the code of the
    close frame the server sends before it ends the connection."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(_UPGRADE)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, buf
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 "), head
        try:
            s.sendall(frames)
        except OSError:
            pass                # closed already: its close frame is in buf
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break           # the server ended the connection
            buf += chunk
    # The server's frames (unmasked): the last is its close.
    codes = []
    while buf:
        opcode, n = buf[0] & 0x0F, buf[1] & 0x7F
        assert n < 126, buf
        if opcode == 8:
            codes.append(int.from_bytes(buf[2:4], "big"))
        buf = buf[2 + n:]
    assert len(codes) == 1, codes
    return codes[0]


@pytest.mark.parametrize("frames, code", [
    pytest.param(_frame(1, b"hi", mask=False), 1002, id="unmasked"),
    pytest.param(_frame(1, b"hi", rsv=4), 1002, id="rsv1-without-an-extension"),
    pytest.param(_frame(1, b"hi", rsv=1), 1002, id="rsv3"),
    pytest.param(_frame(1, b"ok\xff\xfe"), 1007, id="text-not-utf8"),
    pytest.param(_frame(8, (1000).to_bytes(2, "big") + b"\xff"), 1007, id="close-reason-not-utf8"),
    pytest.param(_frame(9, b"p", fin=False), 1002, id="fragmented-ping"),
    pytest.param(_frame(9, b"p" * 126), 1002, id="ping-over-125-bytes"),
    pytest.param(_frame(1, length=1 << 62), 1009, id="2**62-bytes-announced"),
    pytest.param(_frame(2, length=(16 << 20) + 1), 1009, id="just-over-16-MiB"),
    pytest.param(_frame(1, b"fine") + _frame(1, length=1 << 40), 1009, id="after-a-good-message"),
])
def test_a_protocol_error_gets_its_close_code_before_the_connection_ends(serve_port, frames,
                                                                          code):
    _deploy()
    assert _close_frame_after(serve_port, frames) == code


def test_the_size_guard_sees_each_frames_announced_size_however_cut():
    from ray_lite.serve._websocket import _SizeGuard
    ok = (_frame(1, b"a" * 100, fin=False) + _frame(9, b"ping") + _frame(0, b"b" * 100) +
          _frame(2, b"c" * 300) + _frame(10))
    over = _frame(1, b"x" * 200, fin=False) + _frame(0, b"y" * 200)    # 400 > 300: 1009
    for cut in range(1, len(ok) + len(over)):
        data = ok + over
        g = _SizeGuard(300)
        first, second = g.too_big(data[:cut]), g.too_big(data[cut:])
        start = len(ok) + len(_frame(1, b"x" * 200, fin=False))    # the frame over it
        header = 2 + 2 + 4      # 200 bytes: a 2-byte length, then the mask
        if cut <= start:
            assert (first, second) == (-1, start - cut), cut
        elif cut < start + header:      # its header cut: seen whole in the next read
            assert (first, second) == (-1, 0), cut
        else:
            assert first == start, cut
    g = _SizeGuard(300)
    assert g.too_big(_frame(1, b"z" * 300)) == -1 and g.too_big(_frame(1, b"z" * 301)) == 0


def test_an_accept_with_a_header_that_may_not_be_sent_is_a_500(serve_port):
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute

    from ray_lite import serve

    async def splits(ws):
        await ws.accept(headers=[(b"x-echo", b"a\r\nset-cookie: pwned=1")])

    async def bad_protocol(ws):
        await ws.accept(subprotocol="chat\r\nset-cookie: pwned=1")

    @serve.deployment
    @serve.ingress(Starlette(routes=[WebSocketRoute("/splits", splits),
                                     WebSocketRoute("/protocol", bad_protocol)]))
    class Careless:
        pass

    serve.run(Careless.bind())
    for path in (b"/splits", b"/protocol"):
        out = raw(serve_port, _UPGRADE.replace(b"/app/ws", path))
        assert out.startswith(b"HTTP/1.1 500 "), out
        assert b"pwned" not in out and out.count(b"HTTP/1.1") == 1
