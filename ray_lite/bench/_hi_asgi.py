"""The "hi" app as a bare ASGI callable, for uvicorn with several worker
processes (``uvicorn.run`` takes an import string then): the ceiling B8's
goal is relative to.  Standalone: the standard library only."""


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
    await send({"type": "http.response.body", "body": b"hi"})
