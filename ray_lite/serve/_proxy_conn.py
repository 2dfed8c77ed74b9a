"""The proxy's HTTP/1.1 connections (see _proxy): the connection itself is a
hot path, ``ray_lite._fast.http_conn`` (compiled, with a pure-Python twin);
this module gives it what it needs from Serve."""
from ray_lite._fast import http_conn as _http_conn

from . import _core, _websocket
from ._defaults import MAX_HEADER_BYTES, MAX_PIPELINED
from ._http import (CONNECTION_CLOSE, CONNECTION_KEEP_ALIVE, refused_header, status_line,
                    text_answer)

REQUEST_ID_HEADER = b"x-request-id"
# Header (and trailer) lines of one request: 431 beyond (its bytes are
# bounded by MAX_HEADER_BYTES too).
MAX_HEADER_LINES = 256
# A chunk-size line with its extensions: 400 beyond (h11's bound).
MAX_CHUNK_LINE = 16 * 1024


def _load_parser():
    # Imported by the proxy process only, on its first connection (not by
    # whoever imports this module).
    from httptools import HttpParserUpgrade, HttpRequestParser
    return HttpRequestParser, HttpParserUpgrade


def cancel_call(target):
    """Cancel a request's call: a ref or generator in a replica, or (direct
    ingress) the task running it in this process."""
    if type(target) is _LocalCall:
        target.task.cancel()
    else:
        _core.cancel(target)


class _LocalCall:
    """A request run in this process's replica (direct ingress): the task
    that runs it stands where a proxy holds the call's ref."""

    __slots__ = ("task",)

    def __init__(self, task):
        self.task = task


LocalCall = _LocalCall


def bind_to_serve(twin):
    """Give ``twin`` (``http_conn``, or one of its twin modules: the tests
    run both) what its connections need from Serve."""
    twin.bind(load_parser=_load_parser, cancel=cancel_call,
              websocket_take=_websocket.take, websocket_took_over=_websocket.took_over,
              large_bytes=_core.LARGE_BYTES, max_header_bytes=MAX_HEADER_BYTES,
              max_header_lines=MAX_HEADER_LINES, max_chunk_line=MAX_CHUNK_LINE,
              max_pipelined=MAX_PIPELINED, status_line=status_line, text_answer=text_answer,
              refused_header=refused_header,
              connection_close=CONNECTION_CLOSE, connection_keep_alive=CONNECTION_KEEP_ALIVE,
              request_id_header=REQUEST_ID_HEADER)


bind_to_serve(_http_conn)

HttpConnection = _http_conn.HttpConnection
bad_head_line = _http_conn.bad_head_line
HttpRequest = _http_conn.HttpRequest
END_QUIETLY = _http_conn.END_QUIETLY
