"""Serve in a few lines: composition, a streaming handle call, and HTTP.

    python examples/serve_hello.py        # then: curl http://127.0.0.1:8000/?name=you
or  ray-lite serve run serve_hello:app --app-dir examples
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
    import urllib.request
    handle = serve.run(app)
    print(urllib.request.urlopen("http://127.0.0.1:8000/?name=ray_lite", timeout=30).read())
    serve.shutdown()
