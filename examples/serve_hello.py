"""Serve in a few lines: composition, a streaming handle call, and HTTP.

    python examples/serve_hello.py [port]     # asks itself once, then shuts down
or  ray-lite serve run serve_hello:app --app-dir examples
    # then: curl 'http://127.0.0.1:8000/?name=you'
"""
from starlette.requests import Request

from ray_lite import serve


@serve.deployment(num_replicas=2)
class Greeter:
    def greet(self, name):
        return f"hello {name}"

    async def spell(self, name):
        for ch in name:
            yield ch


@serve.deployment
class Ingress:
    def __init__(self, greeter):
        self.greeter = greeter              # a DeploymentHandle

    async def __call__(self, request: Request):
        name = request.query_params.get("name", "world")
        letters = [c async for c in self.greeter.options(stream=True).spell.remote(name)]
        return {"greeting": await self.greeter.greet.remote(name), "letters": letters}


app = Ingress.bind(Greeter.bind())

if __name__ == "__main__":
    import sys
    import urllib.request
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(app)
    print(urllib.request.urlopen(f"http://127.0.0.1:{port}/?name=ray_lite", timeout=30).read().decode())
    serve.shutdown()
