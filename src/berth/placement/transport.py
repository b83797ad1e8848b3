"""Keep-alive HTTP/1.1 on the standard library's ``http.client``, for
:class:`~berth.placement.client.PlacementClient` talking to a real URL.

A compute fleet registering 10,000 hosts makes 30,000 Placement calls, and a scheduler
of the distributed form two per boot. Through httpx each call cost the caller about
0.55 ms of CPU on this machine (building the request and URL objects, cookies, the
connection pool's bookkeeping); through ``http.client`` on a kept connection 0.16 ms,
against the same server. This module is that: one connection per thread, kept open,
checked before reuse (a connection the server closed while idle is replaced, not
failed on), and errors raised as httpx's (``httpx.ConnectError``,
``httpx.ReadTimeout``, ``httpx.RemoteProtocolError``), so callers handle both clients
alike. Tests that call an app in process keep httpx and its transports.

A request that fails on a kept connection the server dropped meanwhile is sent once
more on a new one when its method is idempotent (GET, PUT, DELETE, HEAD); a POST is
not repeated (it may have been applied) and raises.

Several base URLs (the Placement API of several processes, with no load balancer in
front) share the work: each thread's connection goes to the next URL in turn, and one
that refuses connections is passed over for the next (nothing was sent to it).
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlencode, urlsplit

import httpx
import orjson

#: Methods sent again on a new connection when a kept one turns out to be closed.
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})


@runtime_checkable
class TokenSource(Protocol):
    """Where a token comes from (:class:`~berth.webauth.client.KeystoneAuth`)."""

    def token(self) -> str:
        """The token to send (cached by the source)."""

    def invalidate(self) -> None:
        """The server refused the token: fetch a new one next time."""


class Response:
    """An answer: ``status_code``, ``headers`` (lower-case names), ``content``."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    def json(self) -> Any:
        """The body as JSON."""
        return orjson.loads(self.content)

    @property
    def text(self) -> str:
        """The body as text."""
        return self.content.decode("utf-8", "replace")


class _Endpoint:
    """One base URL: where to connect, and the path every request's path follows."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url}: not an http:// or https:// URL")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.ssl = ssl.create_default_context() if self.https else None

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        """A new connection, connected (httpx's connect errors otherwise)."""
        conn = (http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                            context=self.ssl)
                if self.https else http.client.HTTPConnection(self.host, self.port,
                                                              timeout=timeout))
        try:
            conn.connect()
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"{self.host}:{self.port}: no connection within "
                                       f"{timeout:g} s") from exc
        except OSError as exc:  # refused, unreachable, name unknown, TLS refused
            raise httpx.ConnectError(f"{self.host}:{self.port}: {exc}") from exc
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn


class KeptConnections:
    """Requests to a base URL (or several, see the module doc) over a kept connection
    per thread."""

    def __init__(self, base_url: str | Sequence[str], *, headers: Mapping[str, str],
                 timeout: float, auth: TokenSource | None = None) -> None:
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("no base URL")
        self._endpoints = [_Endpoint(url) for url in urls]
        self._turn = 0
        self._headers = dict(headers)
        self._timeout = timeout
        self._auth = auth
        self._local = threading.local()
        self._all: set[http.client.HTTPConnection] = set()
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close every kept connection."""
        with self._lock:
            conns, self._all = list(self._all), set()
        for conn in conns:
            conn.close()

    def request(self, method: str, path: str, *, json: Any = None,
                params: Sequence[tuple[str, Any]] | Mapping[str, Any] | None = None,
                headers: Mapping[str, str] | None = None) -> Response:
        """Send one request and read its answer. With a token source, a 401 fetches a
        new token and sends the request once more."""
        target = path
        if params:
            target += "?" + urlencode(params, doseq=True)
        body = None if json is None else orjson.dumps(json)
        sent = dict(self._headers)
        if body is not None:
            sent["Content-Type"] = "application/json"
        if headers:
            sent.update(headers)
        if self._auth is None:
            return self._send(method, target, body, sent)
        sent["X-Auth-Token"] = self._auth.token()
        resp = self._send(method, target, body, sent)
        if resp.status_code == 401:
            self._auth.invalidate()
            sent["X-Auth-Token"] = self._auth.token()
            resp = self._send(method, target, body, sent)
        return resp

    # ------------------------------------------------------------------ connections
    def _send(self, method: str, target: str, body: bytes | None,
              headers: dict[str, str]) -> Response:
        for attempt in (1, 2):
            conn, prefix, kept = self._connection()
            try:
                conn.request(method, prefix + target, body=body, headers=headers)
                answer = conn.getresponse()
                content = answer.read()
            except TimeoutError as exc:
                self._drop(conn)
                raise httpx.ReadTimeout(f"{method} {target}: no answer within "
                                        f"{self._timeout:g} s") from exc
            except (http.client.RemoteDisconnected, ConnectionError, http.client.BadStatusLine,
                    http.client.IncompleteRead) as exc:
                self._drop(conn)
                if kept and attempt == 1 and method in _IDEMPOTENT:
                    continue  # the server closed the kept connection: once more, anew
                raise httpx.RemoteProtocolError(f"{method} {target}: the connection broke "
                                                f"({exc or type(exc).__name__})") from exc
            except (OSError, http.client.HTTPException) as exc:
                self._drop(conn)
                raise httpx.ReadError(f"{method} {target}: {exc}") from exc
            if answer.will_close:
                self._drop(conn)
            return Response(answer.status, {k.lower(): v for k, v in answer.getheaders()},
                            content)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _connection(self) -> tuple[http.client.HTTPConnection, str, bool]:
        """This thread's connection (a new one when the kept one is gone), its base
        URL's path, and whether it was kept from an earlier request."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            if not _closed(conn):
                return conn, self._local.prefix, True
            self._drop(conn)
        with self._lock:
            first = self._turn
            self._turn = (first + 1) % len(self._endpoints)
        failure: httpx.TransportError | None = None
        for step in range(len(self._endpoints)):
            endpoint = self._endpoints[(first + step) % len(self._endpoints)]
            try:
                conn = endpoint.connection(self._timeout)
            except httpx.TransportError as exc:  # nothing was sent: try the next one
                failure = failure or exc
                continue
            self._local.conn, self._local.prefix = conn, endpoint.prefix
            with self._lock:
                self._all.add(conn)
            return conn, endpoint.prefix, False
        assert failure is not None
        raise failure

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        with self._lock:
            self._all.discard(conn)


def _closed(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle kept connection can no longer be used: no socket, or the server
    closed it (an idle socket that reads as ready holds an end of file or bytes nobody
    asked for)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)
