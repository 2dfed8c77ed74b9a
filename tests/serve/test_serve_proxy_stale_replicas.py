"""A proxy whose replica set still holds a replica that died (the
controller's replacement not in yet): the request it sends there is refused
at once, unseen by the replica, and goes to another replica instead of
getting a 500; a WebSocket too."""
import asyncio
import importlib.util
import os
import signal

import pytest

import ray_lite as ray
from ray_lite import serve
from ray_lite.serve import _core, context
from ray_lite.serve._proxy import ProxyActor

from serve_helpers import PinnedController, http, process_gone, wait_until

T = 60


@serve.deployment(num_replicas=2, graceful_shutdown_wait_loop_s=0, graceful_shutdown_timeout_s=1)
def pid(request):
    return str(os.getpid())


class _PinnedProxy(ProxyActor):
    async def dead_replicas(self, actor_ids):
        """How many of ``actor_ids`` this proxy's process knows to be dead."""
        return len(set(actor_ids) & set(_core.dead_actor_ids()))

    async def replica_count(self):
        return len(self.routes[0].replicas)


def _the_dead_replica_is_passed_over(pid_of, tries):
    """Through a proxy that keeps the app's two replicas for good: kill the
    one ``pid_of(port)`` reaches; ``tries`` more all reach the other."""
    _, routes, _ = ray.get(context.get_controller().listen_routes.remote(0, -1), timeout=T)
    (_app, _dep, handles, *_), = routes.values()
    assert len(handles) == 2
    # A proxy (port 0: a free one) that keeps this set of replicas for good.
    proxy = _core.remote(_PinnedProxy).remote(PinnedController(routes), 0,
                                              {"host": "127.0.0.1", "port": 0})
    try:
        port = ray.get(proxy.start.remote(), timeout=T)
        # Idle, it sends everything to the same replica: the one to kill.
        victim = pid_of(port)
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: process_gone(victim), "the killed replica to exit")
        ids = [_core.actor_id(h) for h in handles]
        wait_until(lambda: ray.get(proxy.dead_replicas.remote(ids), timeout=T) == 1,
                   "the proxy's process to see the death")
        for _ in range(tries):
            assert pid_of(port) != victim
        assert ray.get(proxy.replica_count.remote(), timeout=T) == 1
    finally:
        ray.get(proxy.stop.remote(0), timeout=T)
        ray.kill(proxy)


def test_request_refused_by_a_dead_replica_goes_to_another(serve_port):
    serve.run(pid.bind(), name="stale", route_prefix="/")

    def pid_over_http(port):
        status, _, body = http(port, "GET", "/", timeout=T)
        assert status == 200
        return int(body)
    _the_dead_replica_is_passed_over(pid_over_http, 10)

def _pid_sockets_app():
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute

    async def pid_once(ws):
        await ws.accept()
        await ws.send_text(str(os.getpid()))
        await ws.close()

    return Starlette(routes=[WebSocketRoute("/ws", pid_once)])


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                        for m in ("websockets", "starlette")),
                    reason="websockets or starlette is not installed")
def test_websocket_refused_by_a_dead_replica_goes_to_another(serve_port):
    import websockets

    @serve.deployment(num_replicas=2, graceful_shutdown_wait_loop_s=0,
                      graceful_shutdown_timeout_s=1)
    @serve.ingress(_pid_sockets_app())
    class PidSockets:
        pass

    serve.run(PidSockets.bind(), name="stale", route_prefix="/")

    async def pid_over_a_websocket(port):
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:
            return int(await ws.recv())

    def pid_of_a_websocket(port):
        return asyncio.run(asyncio.wait_for(pid_over_a_websocket(port), T))
    _the_dead_replica_is_passed_over(pid_of_a_websocket, 5)
