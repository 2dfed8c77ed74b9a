"""HTTP's fixed text, in one place: status lines, reason phrases, and the
header lines the replica puts on the answers it builds."""

REASONS = {100: "Continue", 200: "OK", 201: "Created", 202: "Accepted", 204: "No Content",
           301: "Moved Permanently", 302: "Found", 304: "Not Modified",
           307: "Temporary Redirect", 400: "Bad Request", 401: "Unauthorized",
           403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long",
           422: "Unprocessable Entity", 429: "Too Many Requests",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}

_STATUS_LINES = {}


def status_line(status):
    """``HTTP/1.1 <status> <reason>\\r\\n`` as bytes (made once per status)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        line = _STATUS_LINES[status] = (
            f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n".encode())
    return line


TEXT = b"content-type: text/plain; charset=utf-8\r\n"
JSON = b"content-type: application/json\r\n"
OCTET = b"content-type: application/octet-stream\r\n"
CONNECTION_CLOSE = b"connection: close\r\n"
CONNECTION_KEEP_ALIVE = b"connection: keep-alive\r\n"


def sized(ctype, body):
    """The content-type line ``ctype`` and the content-length of ``body``."""
    return ctype + b"content-length: " + str(len(body)).encode() + b"\r\n"


def text_answer(status, text=None):
    """``(header block, body)`` of a plain-text answer (the reason phrase by default)."""
    body = (text or REASONS.get(status, "Error")).encode()
    return sized(TEXT, body), body
