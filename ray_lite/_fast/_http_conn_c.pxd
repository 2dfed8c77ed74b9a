# cython: language_level=3
# Layout of the compiled HTTP connection of a Serve proxy (semantics: see
# _http_conn_py.py, the executable specification).  The attributes the
# proxy, its metrics and its WebSocket relay read or set are public; typed
# fields where Python code only reads them or sets them to the same type.
cimport cython


@cython.final
cdef class HttpRequest:
    cdef public object method           # str
    cdef public object url              # bytes, then (path, query) once routed
    cdef public object headers          # bytes: "name:value" lines joined by CRLF
    cdef public object body             # bytes or memoryview
    cdef public bint keep_alive
    cdef public object version          # str: "1.1", "1.0"
    cdef public object ref
    cdef public object gen
    cdef public object route
    cdef public object rep
    cdef public bint finished
    cdef public object timer
    cdef public double sent
    cdef public object t0
    cdef public int sends
    cdef public object request_id       # bytes or None
    cdef public object ws_headers


cdef class HttpConnection:
    # Not final: the metrics subclass it (in Python) to record each answer.
    cdef public object proxy
    cdef public object parser
    cdef public object transport
    cdef public object client           # "host:port" of the peer, or ""
    cdef public object queue            # collections.deque of pipelined requests
    cdef public object current          # the request being answered, or None
    cdef public bint closed
    cdef public int fail_status         # 0, an HTTP status, or END_QUIETLY
    cdef public bint paused
    cdef public bint in_next
    cdef public bytes url
    cdef public list headers
    cdef public Py_ssize_t header_bytes
    cdef public object body             # None, bytes, or a bytearray that grows
    cdef public Py_ssize_t body_size
    cdef public bint expect_continue
    cdef public int idle_sweeps
    cdef public bint write_paused
    cdef public object write_waiter
    cdef public object request_id
    cdef public Py_ssize_t header_lines
    cdef public bint chunked
    cdef public long long content_length
    cdef public object version          # str, once the head is complete
    cdef public object method           # bytes, once the head is complete
    cdef public int phase               # _HEAD, _BODY, _LINE, _CHUNK
    cdef public Py_ssize_t seq
    cdef public Py_ssize_t raw
    cdef public object feeding
    cdef public Py_ssize_t feed_start
    cdef public Py_ssize_t feed_seq

    cdef inline void _reset(self)
    cdef int _feed(self, object part, Py_ssize_t start, Py_ssize_t end, object data) except -1
    cdef void _next(self) except *
    cdef void _write_error_and_close(self, int status) except *
