"""Kept connections (``berth.placement.transport``, on libcurl) against real sockets:
reuse, a connection the server closed, refused connections, tokens, and a request the
server dropped half-way."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from waitress.server import create_server

from berth.placement.client import ConflictError, PlacementClient
from berth.placement.transport import TLS, KeptConnections


def _app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    size = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(size) if size else b""
    if environ.get("HTTP_X_AUTH_TOKEN") == "stale":
        start_response("401 Unauthorized", [("Content-Type", "application/json")])
        return [b'{"error": "stale token"}']
    if environ["PATH_INFO"].endswith("/conflict"):
        data = json.dumps({"errors": [{"status": 409, "code": "placement.concurrent_update",
                                       "detail": "generation mismatch"}]}).encode()
        start_response("409 Conflict", [("Content-Type", "application/json"),
                                        ("Content-Length", str(len(data)))])
        return [data]
    data = json.dumps({"path": environ["PATH_INFO"], "query": environ["QUERY_STRING"],
                       "method": environ["REQUEST_METHOD"], "body": body.decode(),
                       "port": environ.get("REMOTE_PORT"),
                       "version": environ.get("HTTP_OPENSTACK_API_VERSION"),
                       "type": environ.get("CONTENT_TYPE", ""),
                       "request_id": environ.get("HTTP_X_OPENSTACK_REQUEST_ID")}).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(data)))])
    return [] if environ["REQUEST_METHOD"] == "HEAD" else [data]  # HEAD: the headers alone


def _serve(**options: Any) -> tuple[Any, threading.Thread]:
    """A waitress server of ``_app`` running in a thread."""
    srv = create_server(_app, host="127.0.0.1", port=0, threads=2, **options)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    return srv, thread


def _stop(srv: Any, thread: threading.Thread) -> None:
    """Stop a server from its own loop (closing its sockets from another thread races
    with the loop's select)."""
    def close_all() -> None:
        for channel in list(srv._map.values()):
            channel.close()

    try:
        srv.trigger.pull_trigger(close_all)
    except OSError:
        # Its trigger is closed already (seen once in a whole-suite run on a loaded
        # machine, EBADF): there is no loop left to wake, so close from here.
        close_all()
    thread.join(timeout=5)
    srv.task_dispatcher.shutdown()


@pytest.fixture
def server() -> Iterator[str]:
    """A waitress server of ``_app`` that closes connections idle for 1 s."""
    srv, thread = _serve(channel_timeout=1, cleanup_interval=1)
    try:
        yield f"http://127.0.0.1:{srv.effective_port}/placement"
    finally:
        _stop(srv, thread)


def test_requests_share_one_kept_connection(server: str) -> None:
    http = KeptConnections(server, headers={"OpenStack-API-Version": "placement 1.39"},
                           timeout=5)
    answers = [http.request("PUT", f"/resource_providers/{i}/traits",
                            json={"traits": ["A", "B"], "resource_provider_generation": i},
                            params=[("member_of", "in:a,b"), ("member_of", "c")]).json()
               for i in range(20)]
    assert {a["port"] for a in answers} == {answers[0]["port"]}  # one connection
    assert answers[3]["path"] == "/placement/resource_providers/3/traits"
    assert answers[3]["method"] == "PUT" and answers[3]["version"] == "placement 1.39"
    assert json.loads(answers[3]["body"]) == {"traits": ["A", "B"],
                                              "resource_provider_generation": 3}
    assert answers[3]["query"] == "member_of=in%3Aa%2Cb&member_of=c"
    http.close()


def test_a_connection_the_server_closed_while_idle_is_replaced(server: str) -> None:
    http = KeptConnections(server, headers={}, timeout=5)
    first = http.request("POST", "/resource_providers", json={"name": "a"}).json()["port"]
    time.sleep(2.5)  # past the server's channel timeout: it closes the connection
    again = http.request("POST", "/resource_providers", json={"name": "b"})
    assert again.status_code == 200 and again.json()["port"] != first


def test_each_thread_keeps_its_own_connection(server: str) -> None:
    http = KeptConnections(server, headers={}, timeout=5)
    ports: dict[int, set[str]] = {}

    def calls(n: int) -> None:
        ports[n] = {http.request("GET", "/x").json()["port"] for _ in range(5)}

    threads = [threading.Thread(target=calls, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(p) == 1 for p in ports.values())
    assert len(set().union(*ports.values())) == 3
    http.close()


def test_no_server_is_an_httpx_connect_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = PlacementClient(f"http://127.0.0.1:{port}")
    with pytest.raises(httpx.ConnectError, match=f"127.0.0.1:{port}"):
        client.get_provider("a")


def test_errors_keep_their_placement_code(server: str) -> None:
    with PlacementClient(server) as client, pytest.raises(ConflictError) as err:
        client._call("PUT", "/conflict", json={})
    assert err.value.status == 409 and err.value.is_generation_conflict
    assert err.value.detail == "generation mismatch"


class _Tokens:
    def __init__(self) -> None:
        self.handed = ["stale", "fresh"]
        self.invalidated = 0

    def token(self) -> str:
        return self.handed[0]

    def invalidate(self) -> None:
        self.invalidated += 1
        self.handed.pop(0)


def test_a_refused_token_is_fetched_again_once(server: str) -> None:
    tokens = _Tokens()
    client = PlacementClient(server, auth=tokens)  # type: ignore[arg-type]
    assert client._call("GET", "/x").json()["path"] == "/placement/x"
    assert tokens.invalidated == 1


def _half_server(answered: list[int], posts: list[int]) -> tuple[socket.socket, int]:
    """A server that answers the first request of every connection (kept alive) and
    closes the connection on the second without answering; and closes it on any POST
    without answering (``posts`` counts them)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve(conn: socket.socket) -> None:
        with conn:
            for n in range(2):
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                size = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                             if line.lower().startswith(b"content-length:")), 0)
                while len(rest) < size:
                    rest += conn.recv(65536)
                if data.startswith(b"POST "):
                    posts.append(1)
                    return  # read, then dropped unanswered
                if n == 1:
                    return  # read, then dropped unanswered
                answered.append(1)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 2\r\n\r\n{}")

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener, listener.getsockname()[1]


def test_a_dropped_request_is_sent_again_only_when_idempotent_or_repeatable() -> None:
    answered: list[int] = []
    posts: list[int] = []
    listener, port = _half_server(answered, posts)
    try:
        http = KeptConnections(f"http://127.0.0.1:{port}", headers={}, timeout=5)
        http.request("GET", "/a")
        assert http.request("PUT", "/b", json={}).status_code == 200  # again, anew
        assert len(answered) == 2
        with pytest.raises(httpx.RemoteProtocolError, match="POST /c: the connection broke"):
            http.request("POST", "/c", json={})  # may have been applied: not repeated
        assert len(answered) == 2 and len(posts) == 1
        assert http.request("DELETE", "/d").status_code == 200  # the client goes on
        # A repeatable POST goes on the kept connection, so it may be sent twice.
        with pytest.raises(httpx.RemoteProtocolError):
            http.request("POST", "/e", json={}, repeatable=True)
        assert len(posts) == 3  # dropped on the kept connection, then on a new one
    finally:
        listener.close()


def test_a_repeatable_post_keeps_the_connection(server: str) -> None:
    http = KeptConnections(server, headers={}, timeout=5)
    kept = http.request("GET", "/a").json()["port"]
    # A POST goes on a new connection (never repeated), unless its caller can tell a
    # repeat's answer from a failure.
    assert http.request("POST", "/b", json={}).json()["port"] != kept
    kept = http.request("GET", "/c").json()["port"]
    assert http.request("POST", "/d", json={}, repeatable=True).json()["port"] == kept
    http.close()


def test_threads_share_several_urls_and_pass_over_one_that_refuses() -> None:
    servers = [_serve() for _ in range(2)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    urls = [f"http://127.0.0.1:{servers[0][0].effective_port}/a",
            f"http://127.0.0.1:{dead}/b",
            f"http://127.0.0.1:{servers[1][0].effective_port}/c"]
    try:
        http = KeptConnections(urls, headers={}, timeout=5)
        paths: list[str] = []
        lock = threading.Lock()

        def call() -> None:
            path = http.request("GET", "/x").json()["path"]
            with lock:
                paths.append(path)

        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Each thread took the next URL in turn; the one refusing passed to the next.
        assert sorted(paths) == ["/a/x"] * 2 + ["/c/x"] * 4
        http.close()
        with pytest.raises(httpx.ConnectError, match=str(dead)):
            KeptConnections([urls[1]], headers={}, timeout=5).request("GET", "/x")
    finally:
        for srv, thread in servers:
            _stop(srv, thread)


def test_each_method_sends_its_body_and_only_a_body_says_json(server: str) -> None:
    http = KeptConnections(server, headers={"OpenStack-API-Version": "placement 1.39"},
                           timeout=5)
    for method in ("PUT", "POST", "DELETE", "GET", "PUT"):
        seen = http.request(method, "/m", json={"n": 1} if method == "POST" else None).json()
        assert seen["method"] == method and seen["version"] == "placement 1.39"
        assert (seen["body"], seen["type"]) == (
            ('{"n":1}', "application/json") if method == "POST" else ("", ""))
    seen = http.request("PUT", "/m", json=[1]).json()
    assert (seen["body"], seen["type"]) == ("[1]", "application/json")
    head = http.request("HEAD", "/m")  # headers only, and the connection goes on
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) > 0
    assert http.request("GET", "/m").json()["method"] == "GET"
    http.close()


def test_a_server_that_never_answers_is_a_read_timeout() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    try:
        http = KeptConnections(f"http://127.0.0.1:{listener.getsockname()[1]}", headers={},
                               timeout=1)
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout, match="GET /slow: no answer within 1 s"):
            http.request("GET", "/slow")
        assert time.monotonic() - started < 5
    finally:
        for conn in held:
            conn.close()
        listener.close()


def _tls_server(tmp_path: Any, client_certs: bool = False) -> tuple[Any, threading.Thread, str]:
    """An HTTPS server of ``_app`` (a self-signed certificate for 127.0.0.1) in a
    thread, and the certificate's file (its key beside it, ``key.pem``). With
    ``client_certs``, clients must show that certificate too."""
    import ssl
    import subprocess
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    tmp_path.mkdir(parents=True, exist_ok=True)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    srv = make_server("127.0.0.1", 0, _app, handler_class=Quiet)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if client_certs:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cert)
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    return srv, thread, str(cert)


def test_https_verifies_the_server_with_the_authorities_python_trusts(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    srv, thread, cert = _tls_server(tmp_path)
    url = f"https://127.0.0.1:{srv.server_address[1]}/placement"
    try:
        with pytest.raises(httpx.ConnectError, match="127.0.0.1"):
            KeptConnections(url, headers={}, timeout=5).request("GET", "/x")  # unknown CA
        monkeypatch.setenv("SSL_CERT_FILE", cert)
        http = KeptConnections(url, headers={}, timeout=5)
        assert http.request("GET", "/x").json()["path"] == "/placement/x"
        http.close()
    finally:
        srv.shutdown()
        thread.join(timeout=5)


def _reaches_both_ways(url: str, tls: TLS) -> None:
    """The server answers through the kept connections and through httpx with ``tls``."""
    http = KeptConnections(url, headers={}, timeout=5, tls=tls)
    assert http.request("GET", "/x").json()["path"] == "/placement/x"
    http.close()
    with httpx.Client(verify=tls.ssl_context(), timeout=5) as client:
        assert client.get(url + "/x").json()["path"] == "/placement/x"


def test_https_with_the_configured_authorities_no_check_or_a_client_certificate(
        tmp_path: Any) -> None:
    """``[placement] cafile``, ``insecure`` and ``certfile``/``keyfile`` (as
    :class:`~berth.placement.transport.TLS`) on both clients."""
    srv, thread, cert = _tls_server(tmp_path / "a")
    url = f"https://127.0.0.1:{srv.server_address[1]}/placement"
    try:
        for tls in (TLS(verify=cert), TLS(verify=False), TLS(verify=str(tmp_path / "a"))):
            if tls.verify == str(tmp_path / "a"):
                # A directory of authorities is looked up by hashed names.
                import subprocess

                digest = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", cert],
                                        check=True, capture_output=True, text=True).stdout.strip()
                (tmp_path / "a" / f"{digest}.0").symlink_to(cert)
            _reaches_both_ways(url, tls)
    finally:
        srv.shutdown()
        thread.join(timeout=5)
    srv, thread, cert = _tls_server(tmp_path / "b", client_certs=True)
    url = f"https://127.0.0.1:{srv.server_address[1]}/placement"
    key = str(tmp_path / "b" / "key.pem")
    try:
        with pytest.raises(httpx.HTTPError):
            KeptConnections(url, headers={}, timeout=5, tls=TLS(cert)).request("GET", "/x")
        for tls in (TLS(cert, (cert, key)), TLS(cert, str(tmp_path / "b" / "both.pem"))):
            if isinstance(tls.cert, str):
                (tmp_path / "b" / "both.pem").write_text(Path(cert).read_text() + Path(key).read_text())
            _reaches_both_ways(url, tls)
    finally:
        srv.shutdown()
        thread.join(timeout=5)


def test_the_callers_global_request_id_goes_with_every_call_in_its_thread(server: str) -> None:
    from berth.placement.client import GLOBAL_REQUEST_ID

    with PlacementClient(server) as client:
        assert client._call("GET", "/x").json()["request_id"] is None
        token = GLOBAL_REQUEST_ID.set("req-6f1c2f0e-1b7a-4c33-9d5e-0c6a1e2b3c4d")
        try:
            assert client._call("GET", "/x").json()["request_id"] == GLOBAL_REQUEST_ID.get()
            other: list[Any] = []
            thread = threading.Thread(target=lambda: other.append(
                client._call("GET", "/x").json()["request_id"]))
            thread.start()
            thread.join()
            assert other == [None]
        finally:
            GLOBAL_REQUEST_ID.reset(token)
