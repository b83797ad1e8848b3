"""Minimal WSGI request/response objects and Placement's wire formatting rules.

Covers what the reference's section 1 needs: Accept matching (1.5), the error body in
JSON, HTML or plain text (1.6), JSON body extraction with Placement's texts, and the
cache headers of 1.7. Kept dependency-free so the hot path stays small.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import email.utils
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from berth import json_text
from berth.placement import errors
from berth.placement.microversion import Version
from berth.webauth.identity import Caller

JSON_TYPE = "application/json"

#: WebOb's generic explanation per status, the first sentence of every error ``detail``.
EXPLANATIONS: dict[int, str] = {
    400: "The server could not comply with the request since it is either malformed or "
    "otherwise incorrect.",
    401: "This server could not verify that you are authorized to access the document you "
    "requested. Either you supplied the wrong credentials (e.g., bad password), or your "
    "browser does not understand how to supply the credentials required.",
    403: "Access was denied to this resource.",
    404: "The resource could not be found.",
    405: "The method specified is not allowed for this resource.",
    406: "The resource could not be generated that was acceptable to your browser "
    "(content of type {accept}.",
    409: "There was a conflict when trying to complete your request.",
    415: "The request media type {ctype} is not supported by this server.",
    500: "The server has either erred or is incapable of performing the requested operation.",
    503: "The server is currently unavailable. Please try again at a later time.",
}

REASONS: dict[int, str] = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    409: "Conflict",
    415: "Unsupported Media Type",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


#: The caller as seen by policy (user, project, roles, scope).
Context = Caller


@dataclass
class Request:
    """One HTTP request: the WSGI environ plus what the middleware layers learnt."""

    environ: dict[str, Any]
    request_id: str
    version: Version = Version(1, 0)
    context: Context | None = None
    _body: bytes | None = None
    _query: list[tuple[str, str]] | None = None

    @property
    def method(self) -> str:
        """The HTTP method, upper case."""
        return str(self.environ.get("REQUEST_METHOD", "GET")).upper()

    @property
    def path(self) -> str:
        """PATH_INFO decoded as UTF-8 (WSGI hands it over as latin-1)."""
        raw = str(self.environ.get("PATH_INFO", ""))
        try:
            return raw.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            return raw

    @property
    def script_name(self) -> str:
        """The mount prefix (``SCRIPT_NAME``) without a trailing slash."""
        return str(self.environ.get("SCRIPT_NAME", "")).rstrip("/")

    def header(self, name: str) -> str | None:
        """A request header by case-insensitive name, or None."""
        key = name.upper().replace("-", "_")
        if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            value = self.environ.get(key)
            if (
                key == "CONTENT_TYPE"
                and value == "text/plain"
                and str(self.environ.get("SERVER_SOFTWARE", "")).startswith("WSGIServer/")
            ):
                # wsgiref invents text/plain when the client sent no Content-Type; Placement
                # must see that as missing (reference 1.5 quirk).
                return None
            return None if value in (None, "") else str(value)
        value = self.environ.get("HTTP_" + key)
        return None if value is None else str(value)

    @property
    def query(self) -> list[tuple[str, str]]:
        """The query string as ordered (name, value) pairs, blanks kept."""
        if self._query is None:
            raw = str(self.environ.get("QUERY_STRING", ""))
            with contextlib.suppress(UnicodeEncodeError, UnicodeDecodeError):
                raw = raw.encode("latin-1").decode("utf-8")
            self._query = parse_qsl(raw, keep_blank_values=True)
        return self._query

    def query_multi(self) -> dict[str, list[str]]:
        """The query string as name -> list of values, in order."""
        out: dict[str, list[str]] = {}
        for key, value in self.query:
            out.setdefault(key, []).append(value)
        return out

    def query_last(self) -> dict[str, str]:
        """The query string as a dict where the last value of a name wins."""
        return dict(self.query)

    @property
    def host_url(self) -> str:
        """``scheme://host[:port]`` as the client addressed us."""
        env = self.environ
        scheme = str(env.get("wsgi.url_scheme", "http"))
        host = env.get("HTTP_HOST")
        if not host:
            host = str(env.get("SERVER_NAME", "localhost"))
            port = str(env.get("SERVER_PORT", ""))
            if port and not (
                (scheme == "http" and port == "80") or (scheme == "https" and port == "443")
            ):
                host = f"{host}:{port}"
        return f"{scheme}://{host}"

    def link(self, path: str) -> str:
        """A relative link including the mount prefix."""
        return self.script_name + path

    def location(self, path: str) -> str:
        """An absolute URL for a Location header."""
        return self.host_url + self.script_name + path

    @property
    def body(self) -> bytes:
        """The request body (read once)."""
        if self._body is None:
            length_text = self.environ.get("CONTENT_LENGTH") or "0"
            try:
                length = int(length_text)
            except ValueError:
                length = 0
            stream = self.environ.get("wsgi.input")
            self._body = stream.read(length) if (stream is not None and length > 0) else b""
        return self._body

    def json_body(self) -> Any:
        """Decode the body as JSON or raise Placement's ``Malformed JSON`` 400."""
        try:
            value = json.loads(self.body.decode("utf-8"), parse_constant=_reject_constant,
                               parse_float=_finite_float)
        except (ValueError, UnicodeDecodeError) as exc:
            raise errors.BadRequest(f"Malformed JSON: {exc}") from None
        except RecursionError:
            raise errors.BadRequest("Malformed JSON: nesting too deep") from None
        # Integers are the schemas' to bound (Placement's own messages).
        bad = json_text.problem(self.body, value, big_ints=False)
        if bad is not None:
            raise errors.BadRequest(f"Malformed JSON: {bad}")
        return value


def _finite_float(text: str) -> float:
    """A JSON number past the float range (``-1e400``) would be an infinity."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"Number out of range: {text}")
    return value


def _reject_constant(name: str) -> Any:
    """NaN and Infinity are not JSON; accepting them would poison capacity arithmetic."""
    raise ValueError(f"Invalid JSON constant: {name}")


@dataclass
class Response:
    """A response under construction."""

    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def set_header(self, name: str, value: str) -> None:
        """Set (replace) a header."""
        lname = name.lower()
        self.headers = [(k, v) for (k, v) in self.headers if k.lower() != lname]
        self.headers.append((name, value))

    def get_header(self, name: str) -> str | None:
        """A response header value or None."""
        lname = name.lower()
        for key, value in self.headers:
            if key.lower() == lname:
                return value
        return None


def json_response(
    data: Any, *, status: int = 200, headers: Iterable[tuple[str, str]] = ()
) -> Response:
    """A JSON response with ``Content-Type: application/json``."""
    body = json.dumps(data, separators=(", ", ": ")).encode("utf-8")
    resp = Response(status=status, headers=[("Content-Type", JSON_TYPE)], body=body)
    resp.headers.extend(headers)
    return resp


def empty_response(status: int = 204, headers: Iterable[tuple[str, str]] = ()) -> Response:
    """A body-less response (201/204) without Content-Type."""
    return Response(status=status, headers=list(headers))


def http_date(when: dt.datetime) -> str:
    """RFC 1123 date in GMT, as ``last-modified`` wants it."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return email.utils.format_datetime(when.astimezone(dt.UTC), usegmt=True)


def add_cache_headers(req: Request, resp: Response, last_modified: dt.datetime | None) -> None:
    """From 1.15 add ``cache-control: no-cache`` and, when known, ``last-modified``."""
    if req.version < (1, 15):
        return
    resp.set_header("cache-control", "no-cache")
    if last_modified is not None:
        resp.set_header("last-modified", http_date(last_modified))


def newest(stamps: Iterable[dt.datetime | None]) -> dt.datetime | None:
    """The newest of some timestamps, None if there are none."""
    best: dt.datetime | None = None
    for stamp in stamps:
        if stamp is not None and (best is None or stamp > best):
            best = stamp
    return best


# --- content negotiation -------------------------------------------------------------


def _parse_accept(value: str) -> list[tuple[str, float]]:
    """Accept header -> [(media range, q)]."""
    out: list[tuple[str, float]] = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        parts = [p.strip() for p in item.split(";")]
        q = 1.0
        for param in parts[1:]:
            if param.lower().startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        out.append((parts[0].lower(), q))
    return out


def accept_quality(accept: str | None, offer: str) -> float:
    """The q-value an Accept header gives ``offer`` (most specific range wins); 0 = not."""
    if accept is None:
        return 1.0
    major = offer.split("/")[0]
    best_spec = -1
    best_q = 0.0
    for media, q in _parse_accept(accept):
        if media == offer:
            spec = 2
        elif media == f"{major}/*":
            spec = 1
        elif media == "*/*" or media == "*":
            spec = 0
        else:
            continue
        if spec > best_spec:
            best_spec, best_q = spec, q
    return best_q


def accepts_json(accept: str | None) -> bool:
    """Whether a response in JSON is acceptable under this Accept header."""
    if accept is None or not accept.strip():
        return True
    return accept_quality(accept, JSON_TYPE) > 0


def error_format(accept: str | None) -> str:
    """Pick the error body type like WebOb: html beats json on a tie; else plain text."""
    html = accept_quality(accept, "text/html") if accept else 0.0
    js = accept_quality(accept, JSON_TYPE) if accept else 1.0
    if html <= 0 and js <= 0:
        return "text/plain"
    return "text/html" if html >= js else JSON_TYPE


_BR = re.compile(r"<br.*?>", re.I | re.S)
_COMMENT = re.compile(r"<!--|-->")
_TAG = re.compile(r"<.*?>", re.S)


def strip_tags(value: str) -> str:
    """What WebOb does to an error's text before Placement puts it in a JSON (or plain
    text) answer: newlines become spaces, ``<br>`` a newline, and tags and comment marks
    go (a schema error's multi-line text comes out on one line)."""
    value = value.replace("\n", " ").replace("\r", "")
    return _TAG.sub("", _COMMENT.sub("", _BR.sub("\n", value)))


def error_detail(status: int, message: str, *, accept: str = "", ctype: str = "",
                 strip: bool = True) -> str:
    """WebOb's generic sentence, a blank line, the specific message (``strip``: as
    :func:`strip_tags` leaves it, as in JSON and plain text) and two spaces."""
    if status == 405:
        # WebOb's 405 text already is "The method X is not allowed ... \n\n <generic>".
        return message
    if strip:
        message = strip_tags(message)
    explanation = EXPLANATIONS.get(status, "").format(accept=accept, ctype=ctype)
    if status == 415:
        explanation += " "
    return f"{explanation}\n\n {message}  "


def render_error(
    req: Request,
    status: int,
    message: str,
    *,
    code: str | None,
    extra: Mapping[str, Any] | None = None,
    headers: Iterable[tuple[str, str]] = (),
) -> Response:
    """Build Placement's error response (reference 1.6) in the format Accept prefers."""
    title = REASONS.get(status, "Error")
    accept_hdr = req.header("Accept")
    kind = error_format(accept_hdr)
    detail = error_detail(
        status,
        message,
        accept=accept_hdr or "",
        ctype=str(req.header("Content-Type")),
        strip=kind != "text/html",
    )
    resp = Response(status=status, headers=list(headers))
    if kind == JSON_TYPE:
        entry: dict[str, Any] = {"status": status, "title": title, "detail": detail}
        if code is not None:
            entry["code"] = code
        entry["request_id"] = req.request_id
        if extra:
            entry.update(extra)
        resp.body = json.dumps({"errors": [entry]}).encode("utf-8")
        resp.set_header("Content-Type", JSON_TYPE)
    elif kind == "text/html":
        html_detail = detail.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        resp.body = (
            f"<html>\n <head>\n  <title>{status} {title}</title>\n </head>\n <body>\n"
            f"  <h1>{status} {title}</h1>\n  {html_detail}\n\n\n </body>\n</html>"
        ).encode()
        resp.set_header("Content-Type", "text/html; charset=UTF-8")
    else:
        resp.body = f"{status} {title}\n\n{detail}\n\n".encode()
        resp.set_header("Content-Type", "text/plain; charset=UTF-8")
    return resp
