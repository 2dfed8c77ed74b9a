"""A Serve proxy's HTTP/1.1 connection (compiled twin ``_http_conn_c``,
fallback ``_http_conn_py``, which documents the semantics).

``HttpConnection(proxy)``   the asyncio protocol of one TCP connection: parses
                            with httptools, hands each complete request to
                            ``proxy.dispatch(conn, req)``, answers with
                            ``conn.respond(req, status, headers, body)``.
``HttpRequest``             one parsed request.
``bind(**serve_parts)``     what connections need from Serve, once per process.
``END_QUIETLY``             ``fail_status`` of a connection that ends after
                            its answers without an error.
``bad_header(pairs)``       the name of the first ``(name, value)`` that may
                            not be sent in an answer's head, else None.
``bad_head_line(block)``    the same for a header block (``name:value``
                            lines ended by CRLF).
"""
from ._select import load_twin

_impl, COMPILED = load_twin("http_conn")

HttpConnection = _impl.HttpConnection
HttpRequest = _impl.HttpRequest
bind = _impl.bind
END_QUIETLY = _impl.END_QUIETLY
bad_header = _impl.bad_header
bad_head_line = _impl.bad_head_line

__all__ = ["COMPILED", "END_QUIETLY", "HttpConnection", "HttpRequest", "bad_head_line",
           "bad_header", "bind"]
