"""Keep-alive HTTP/1.1 on libcurl (pycurl), for
:class:`~berth.placement.client.PlacementClient` talking to a real URL.

A compute fleet registering 10,000 hosts makes 30,000 Placement calls. Through httpx
each call cost the caller about 0.55 ms of CPU on this machine (building the request
and URL objects, cookies, the connection pool's bookkeeping); through the standard
library's ``http.client`` on a kept connection 0.3-0.5 ms (most of it parsing the
answer's headers with the ``email`` package); through libcurl 0.13 ms, against the same
server. This module is that: one curl handle per thread, whose connection libcurl keeps
open and checks before reuse (a connection the server closed while idle is replaced,
not failed on), and errors raised as httpx's (``httpx.ConnectError``,
``httpx.ConnectTimeout``, ``httpx.ReadTimeout``, ``httpx.RemoteProtocolError``,
``httpx.ReadError``), so callers handle both clients alike. Tests that call an app in
process keep httpx and its transports.

A request that fails on a kept connection the server dropped meanwhile is sent once
more on a new one (libcurl does so when nothing of an answer came back); a POST is
never sent on a kept connection, so it is never repeated (it may have been applied):
it goes on a new connection, which the requests after it keep. A caller that can tell
a repeated POST's answer from a failure (``repeatable``: a compute agent creating its
provider under its own uuid reads the provider back after a 409) sends it on the kept
connection: a new connection a host costs the server an accept and a channel.

Several base URLs (the Placement API of several processes, with no load balancer in
front) share the work: each thread's handle goes to the next URL in turn, and one that
refuses connections is passed over for the next (nothing was sent to it).
"""

from __future__ import annotations

import math
import os
import ssl
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlencode, urlsplit

import httpx
import orjson
import pycurl

#: libcurl's errors for a connection that was never made (nothing was sent).
_NOT_CONNECTED = frozenset({pycurl.E_COULDNT_CONNECT, pycurl.E_COULDNT_RESOLVE_HOST,
                            pycurl.E_SSL_CONNECT_ERROR, pycurl.E_PEER_FAILED_VERIFICATION})
#: ... for a connection that broke before the whole answer came.
_BROKE = frozenset({pycurl.E_GOT_NOTHING, pycurl.E_SEND_ERROR, pycurl.E_RECV_ERROR,
                    pycurl.E_PARTIAL_FILE})


@dataclass(frozen=True)
class TLS:
    """How a client checks the server and shows itself over HTTPS: ``verify`` True (the
    authorities Python's TLS trusts), a file or directory of authorities, or False (no
    check); ``cert`` a client certificate file (with its key), or (certificate, key)."""

    verify: bool | str = True
    cert: str | tuple[str, str] | None = None

    def ssl_context(self) -> ssl.SSLContext | bool:
        """The same for httpx: True, or a context."""
        if self.verify is True and not self.cert:
            return True
        if isinstance(self.verify, str):
            if os.path.isdir(self.verify):
                context = ssl.create_default_context(capath=self.verify)
            else:
                context = ssl.create_default_context(cafile=self.verify)
        else:
            context = ssl.create_default_context()
            if self.verify is False:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        if isinstance(self.cert, tuple):
            context.load_cert_chain(self.cert[0], self.cert[1])
        elif self.cert:
            context.load_cert_chain(self.cert)
        return context


#: Verify with the authorities Python's TLS trusts; no client certificate.
SYSTEM_TLS = TLS()

#: Seconds a Placement call may wait for a connection or the next byte of its answer.
DEFAULT_TIMEOUT = 30.0


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
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.base = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


class _Handle:
    """One thread's curl handle and the endpoint it talks to; the answer's header lines
    and body are gathered by its callbacks."""

    __slots__ = ("curl", "endpoint", "head", "body")

    def __init__(self, endpoint: int, timeout: float, tls: TLS) -> None:
        self.endpoint = endpoint
        self.head: list[bytes] = []
        self.body: list[bytes] = []
        curl = self.curl = pycurl.Curl()
        curl.setopt(pycurl.NOSIGNAL, 1)  # timeouts without SIGALRM: safe in threads
        curl.setopt(pycurl.TCP_NODELAY, 1)
        curl.setopt(pycurl.MAXCONNECTS, 1)  # a POST's new connection replaces the kept one
        # As a socket timeout: ``timeout`` to connect, then to see each next byte (an
        # answer that keeps coming may take longer in all).
        curl.setopt(pycurl.CONNECTTIMEOUT_MS, max(1, int(timeout * 1000)))
        curl.setopt(pycurl.LOW_SPEED_LIMIT, 1)
        curl.setopt(pycurl.LOW_SPEED_TIME, max(1, math.ceil(timeout)))
        curl.setopt(pycurl.HEADERFUNCTION, self.head.append)
        curl.setopt(pycurl.WRITEFUNCTION, self.body.append)
        if tls.verify is False:
            curl.setopt(pycurl.SSL_VERIFYPEER, 0)
            curl.setopt(pycurl.SSL_VERIFYHOST, 0)
        elif isinstance(tls.verify, str):
            curl.setopt(pycurl.CAPATH if os.path.isdir(tls.verify) else pycurl.CAINFO, tls.verify)
        else:
            # The authorities Python's own TLS verifies with (SSL_CERT_FILE/DIR included).
            paths = ssl.get_default_verify_paths()
            if paths.cafile:
                curl.setopt(pycurl.CAINFO, paths.cafile)
            elif paths.capath:
                curl.setopt(pycurl.CAPATH, paths.capath)
        if isinstance(tls.cert, tuple):
            curl.setopt(pycurl.SSLCERT, tls.cert[0])
            curl.setopt(pycurl.SSLKEY, tls.cert[1])
        elif tls.cert:
            curl.setopt(pycurl.SSLCERT, tls.cert)  # the key in the same file

    def close(self) -> None:
        self.curl.close()


class KeptConnections:
    """Requests to a base URL (or several, see the module doc) over a kept connection
    per thread."""

    def __init__(self, base_url: str | Sequence[str], *, headers: Mapping[str, str],
                 timeout: float, auth: TokenSource | None = None, tls: TLS | None = None) -> None:
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("no base URL")
        self._endpoints = [_Endpoint(url) for url in urls]
        self._turn = 0
        # "Expect:" stops libcurl from waiting for a 100 Continue before a large body.
        self._headers = [f"{k}: {v}" for k, v in headers.items()] + ["Expect:"]
        self._timeout = timeout
        self._auth = auth
        self._tls = tls or SYSTEM_TLS
        self._local = threading.local()
        self._all: set[_Handle] = set()
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close every kept connection."""
        with self._lock:
            handles, self._all = list(self._all), set()
        for handle in handles:
            handle.close()
        self._local = threading.local()

    def request(self, method: str, path: str, *, json: Any = None,
                params: Sequence[tuple[str, Any]] | Mapping[str, Any] | None = None,
                headers: Mapping[str, str] | None = None,
                repeatable: bool = False) -> Response:
        """Send one request and read its answer. With a token source, a 401 fetches a
        new token and sends the request once more. ``repeatable``: a POST may go on a
        kept connection, and so be sent twice (see the module's docstring)."""
        target = path
        if params:
            target += "?" + urlencode(params, doseq=True)
        body = None if json is None else orjson.dumps(json)
        sent = list(self._headers)
        if body is not None:
            sent.append("Content-Type: application/json")
        if headers:
            sent += [f"{k}: {v}" for k, v in headers.items()]
        fresh = method == "POST" and not repeatable
        if self._auth is None:
            return self._send(method, target, body, sent, fresh)
        resp = self._send(method, target, body,
                          [*sent, f"X-Auth-Token: {self._auth.token()}"], fresh)
        if resp.status_code == 401:
            self._auth.invalidate()
            resp = self._send(method, target, body,
                              [*sent, f"X-Auth-Token: {self._auth.token()}"], fresh)
        return resp

    # ------------------------------------------------------------------ connections
    def _send(self, method: str, target: str, body: bytes | None,
              headers: list[str], fresh: bool) -> Response:
        handle = self._handle()
        failure: httpx.TransportError | None = None
        for step in range(len(self._endpoints)):
            if step:  # the last endpoint refused: the next one in turn, for good
                handle.endpoint = (handle.endpoint + 1) % len(self._endpoints)
            try:
                return self._perform(handle, method, target, body, headers, fresh)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure = failure or exc  # nothing was sent: try the next one
        assert failure is not None
        raise failure

    def _perform(self, handle: _Handle, method: str, target: str, body: bytes | None,
                 headers: list[str], fresh: bool) -> Response:
        endpoint = self._endpoints[handle.endpoint]
        curl = handle.curl
        del handle.head[:], handle.body[:]
        curl.setopt(pycurl.URL, endpoint.base + target)
        curl.setopt(pycurl.HTTPHEADER, headers)
        curl.setopt(pycurl.FRESH_CONNECT, 1 if fresh else 0)
        if method == "GET":
            curl.setopt(pycurl.HTTPGET, 1)
        elif method == "HEAD":
            curl.setopt(pycurl.NOBODY, 1)
        else:
            curl.setopt(pycurl.NOBODY, 0)
            curl.setopt(pycurl.POSTFIELDS, body or b"")
            curl.setopt(pycurl.CUSTOMREQUEST, method)
            if body is None:  # no form content type for an empty body
                curl.setopt(pycurl.HTTPHEADER, [*headers, "Content-Type:"])
        try:
            curl.perform()
        except pycurl.error as exc:
            code = exc.args[0]
            where = f"{endpoint.host}:{endpoint.port}"
            if code in _NOT_CONNECTED:
                raise httpx.ConnectError(f"{where}: {exc.args[1]}") from None
            if code == pycurl.E_OPERATION_TIMEDOUT:
                if not curl.getinfo(pycurl.CONNECT_TIME):
                    raise httpx.ConnectTimeout(f"{where}: no connection within "
                                               f"{self._timeout:g} s") from None
                raise httpx.ReadTimeout(f"{method} {target}: no answer within "
                                        f"{self._timeout:g} s") from None
            if code in _BROKE:
                raise httpx.RemoteProtocolError(f"{method} {target}: the connection broke "
                                                f"({exc.args[1]})") from None
            raise httpx.ReadError(f"{method} {target}: {exc.args[1]}") from None
        finally:
            if method == "HEAD":
                curl.setopt(pycurl.NOBODY, 0)
            elif method != "GET":
                curl.unsetopt(pycurl.CUSTOMREQUEST)
        return Response(curl.getinfo(pycurl.RESPONSE_CODE), _headers(handle.head),
                        b"".join(handle.body))

    def _handle(self) -> _Handle:
        """This thread's handle (a new one, on the next endpoint in turn, the first
        time)."""
        handle: _Handle | None = getattr(self._local, "handle", None)
        if handle is None:
            with self._lock:
                first = self._turn
                self._turn = (first + 1) % len(self._endpoints)
            handle = self._local.handle = _Handle(first, self._timeout, self._tls)
            with self._lock:
                self._all.add(handle)
        return handle


def _headers(lines: list[bytes]) -> dict[str, str]:
    """The last answer's headers (a 100 Continue or a redirect's come first), with
    lower-case names."""
    out: dict[str, str] = {}
    for raw in lines:
        line = raw.decode("latin-1")
        if line.startswith("HTTP/"):
            out = {}
            continue
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip().lower()] = value.strip()
    return out
