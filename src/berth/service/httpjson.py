"""JSON over WSGI for the scheduler API and the web view: reading a bounded body,
answering with a status and a JSON body."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from berth import json_text
from berth.errors import InputError

#: The largest request body read (bytes).
MAX_BODY = 1 << 20

StartResponse = Callable[..., Any]

REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized",
           403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
           500: "Internal Server Error", 503: "Service Unavailable"}


def read_json(environ: dict[str, Any]) -> Any:
    """The request body as JSON (``null`` when empty); InputError naming the problem."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise InputError("Content-Length: not an integer") from None
    if length < 0:
        raise InputError(f"Content-Length: expected a size >= 0, got {length}")
    if length > MAX_BODY:
        raise InputError(f"body: larger than {MAX_BODY} bytes")
    raw = environ["wsgi.input"].read(length) if length else b""
    try:
        # UTF-8 only (RFC 8259): json.loads(bytes) would also take UTF-16 and UTF-32,
        # and encoded surrogates, past the checks below.
        value = json.loads(raw.decode("utf-8") if raw else "null")
    except ValueError as exc:  # UnicodeDecodeError included
        raise InputError(f"body: Malformed JSON: {exc}") from None
    except RecursionError:
        raise InputError("body: Malformed JSON: nesting too deep") from None
    bad = json_text.problem(raw, value)
    if bad is not None:
        raise InputError(bad, field=bad.partition(":")[0])
    return value


def json_default(value: Any) -> Any:
    """What ``json`` cannot encode: sets as sorted lists, anything else as text (a
    filter's rejection numbers may hold such values: never a 500 for those)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def reply(start_response: StartResponse, status: int, body: Any,
          headers: Iterable[tuple[str, str]] = ()) -> list[bytes]:
    """Answer ``status`` with ``body`` as JSON."""
    data = json.dumps(body, default=json_default).encode()
    start_response(f"{status} {REASONS[status]}", [("Content-Type", "application/json"),
                                                   ("Content-Length", str(len(data))),
                                                   ("X-Content-Type-Options", "nosniff"),
                                                   *headers])
    return [data]


def reply_bytes(start_response: StartResponse, status: int, data: bytes, content_type: str,
                headers: Iterable[tuple[str, str]] = ()) -> list[bytes]:
    """Answer ``status`` with ``data`` as ``content_type``."""
    start_response(f"{status} {REASONS[status]}", [("Content-Type", content_type),
                                                   ("Content-Length", str(len(data))),
                                                   ("X-Content-Type-Options", "nosniff"),
                                                   *headers])
    return [data]
