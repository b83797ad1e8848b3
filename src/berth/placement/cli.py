"""``berth placement serve``: run the Placement-compatible API on waitress (the project's
one WSGI server, as behind ``berth serve`` and ``berth api``).

With no options it serves 127.0.0.1:8778 over ``./berth-placement.sqlite`` (created and
migrated on start-up). ``--db`` takes any SQLAlchemy URL, e.g.
``postgresql+psycopg://postgres@127.0.0.1:5432/test``. SIGTERM and SIGINT stop it
gracefully: the listener closes and in-flight requests finish.

Waitress reads every request whole in its event loop before a worker thread sees it, so
slow or half-sent requests hold no worker (a client that stalls is dropped after
``--channel-timeout`` seconds), and a body longer than ``--max-body`` (1 MiB by default:
Placement's bodies are small; a reshape of a few hundred providers fits) is answered 413
before it is read.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from berth.errors import ConfigError
from berth.placement.db import error_line, shown_url
from berth.webauth.options import add_arguments

DEFAULT_DB = "sqlite:///berth-placement.sqlite"
DEFAULT_PORT = 8778
#: The largest request body accepted (bytes).
DEFAULT_MAX_BODY = 1024 * 1024
#: Seconds a connection may stay idle (or stall mid-request) before it is closed.
DEFAULT_CHANNEL_TIMEOUT = 60

LOG = logging.getLogger("berth.placement")


#: Bounds of a server's processes and threads: past them a typo forks or starts
#: threads until the machine gives out.
MAX_WORKERS = 256
MAX_THREADS = 1024


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8778)")
    parser.add_argument(
        "--db",
        default=DEFAULT_DB,
        help="SQLAlchemy URL or SQLite file path (default ./berth-placement.sqlite)",
    )
    parser.add_argument("--config-file", action="append", default=[],
                        help="placement.conf / nova.conf: [api] auth_strategy, "
                             "[keystone_authtoken], [oslo_policy] (repeatable)")
    add_arguments(parser)
    parser.add_argument(
        "--cors-origin", action="append", default=[], help="allowed CORS origin (repeatable)"
    )
    parser.add_argument(
        "--cors-allow-header",
        action="append",
        default=[],
        help="extra request header allowed in CORS preflights (repeatable)",
    )
    parser.add_argument("--prefix", default="", help="mount path, e.g. /placement")
    parser.add_argument("--threads", type=int, default=8, help="threads per process (default 8)")
    parser.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY,
                        help="largest request body in bytes (default 1 MiB; larger: 413)")
    parser.add_argument("--channel-timeout", type=int, default=DEFAULT_CHANNEL_TIMEOUT,
                        help="seconds an idle or stalled connection is kept (default 60)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes sharing the listening socket (default 1); more processes "
        "sidestep the GIL, the database keeps them consistent",
    )


def add_subparser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``placement`` (with its ``serve`` command) on a parent CLI's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "placement", help="the Placement-compatible resource store"
    )
    _fill(parser)
    return parser


def _fill(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="placement_command", required=True)
    serve = sub.add_parser("serve", help="serve the Placement HTTP API")
    _add_serve_arguments(serve)
    serve.set_defaults(placement_func=serve_command)


def build_parser() -> argparse.ArgumentParser:
    """The standalone parser (``python -m berth.placement``)."""
    parser = argparse.ArgumentParser(prog="berth placement", description=__doc__)
    _fill(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``berth placement ...``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    func = args.placement_func
    return int(func(args))


def make_wsgi_app(
    db_url: str,
    *,
    security: Any = None,
    cors_origins: Sequence[str] = (),
    cors_allow_headers: Sequence[str] = (),
    prefix: str = "",
) -> Any:
    """Prepare the database and return the WSGI callable (prefix-aware, behind the
    authentication middleware ``security`` needs)."""
    from berth.placement.app import CorsConfig, make_app
    from berth.placement.db import prepare
    from berth.placement.store import PlacementStore

    engine = prepare(db_url)
    cors = CorsConfig(tuple(cors_origins), tuple(cors_allow_headers)) if cors_origins else None
    app: Any = make_app(PlacementStore(engine), security=security, cors=cors)
    if security is not None:
        app = security.identity.wrap(app)
    prefix = prefix.rstrip("/")
    if not prefix:
        return app

    def mounted(environ: dict[str, Any], start_response: Any) -> Any:
        """Serve the app under ``prefix`` (moved from PATH_INFO to SCRIPT_NAME); 404 elsewhere."""
        path = environ.get("PATH_INFO", "")
        if path == prefix or path.startswith(prefix + "/"):
            environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "") + prefix
            environ["PATH_INFO"] = path[len(prefix) :]
            return app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", "9")])
        return [b"Not Found"]

    return mounted


def serve_command(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM/SIGINT."""
    from berth.service.metrics import configure_logging

    configure_logging()
    logging.getLogger("alembic").setLevel(logging.WARNING)
    for name in ("workers", "threads", "max_body", "channel_timeout"):
        if getattr(args, name) < 1:
            print(f"berth placement serve: --{name.replace('_', '-')} must be >= 1, got "
                  f"{getattr(args, name)}", file=sys.stderr)
            return 2
    for name, most in (("workers", MAX_WORKERS), ("threads", MAX_THREADS)):
        if getattr(args, name) > most:
            print(f"berth placement serve: --{name} must be at most {most}, got "
                  f"{getattr(args, name)}", file=sys.stderr)
            return 2
    if not 0 <= args.port <= 65535:
        print(f"berth placement serve: --port must be 0-65535, got {args.port}", file=sys.stderr)
        return 2
    if args.prefix and not args.prefix.startswith("/"):
        print(f"berth placement serve: --prefix must start with '/', got {args.prefix!r}",
              file=sys.stderr)
        return 2
    try:
        from berth.placement.app import placement_rules
        from berth.webauth.settings import security_from_args

        [args.security] = security_from_args(args, args.config_file, placement_rules())
    except ConfigError as exc:
        print(f"berth placement serve: {exc}", file=sys.stderr)
        return 2
    try:
        # Migrate once, before any worker starts.
        from berth.placement.db import prepare

        prepare(args.db).dispose()
    except Exception as exc:  # start-up problems are reported, not traced
        print(f"berth placement serve: cannot open database {shown_url(args.db)!r}: "
              f"{error_line(exc)}", file=sys.stderr)
        return 2
    if args.workers == 1:
        try:
            sock = _listen(args.host, args.port, reuse_port=False)
        except OSError as exc:
            print(f"berth placement serve: cannot listen: {exc}", file=sys.stderr)
            return 2
        server = _make_server(args, sock)
        _announce(args, sock.getsockname()[1])
        return _run(server)
    return _serve_prefork(args)


def _announce(args: argparse.Namespace, port: int) -> None:
    LOG.info(
        "berth placement serving on http://%s:%s%s (db %s, %s, %d process(es))",
        args.host,
        port,
        args.prefix,
        shown_url(args.db),
        args.security.describe(),
        args.workers,
    )
    print(f"listening on http://{args.host}:{port}{args.prefix}", flush=True)


def _listen(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    """A listening TCP socket (with SO_REUSEPORT for the processes of a prefork)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def _make_server(args: argparse.Namespace, sock: socket.socket) -> Any:
    """A waitress server on ``sock`` for this process (the app is built here, after any
    fork)."""
    from waitress.server import create_server

    app = make_wsgi_app(
        args.db,
        security=args.security,
        cors_origins=args.cors_origin,
        cors_allow_headers=args.cors_allow_header,
        prefix=args.prefix,
    )
    from berth.service.metrics import Metrics, instrument, queue_collector

    metrics = Metrics()
    server = create_server(instrument(app, metrics, "placement", mount=args.prefix),
                           sockets=[sock],
                           threads=args.threads, ident="berth-placement",
                           max_request_body_size=args.max_body,
                           channel_timeout=args.channel_timeout, backlog=1024,
                           clear_untrusted_proxy_headers=True)
    metrics.add(queue_collector(server))
    return server


def _run(server: Any) -> int:
    """Serve until SIGTERM/SIGINT, then stop accepting; running requests get a few
    seconds to finish."""

    def _stop(signum: int, _frame: Any) -> None:
        LOG.info("signal %s: shutting down", signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def _serve_prefork(args: argparse.Namespace) -> int:
    """N processes, each with its own SO_REUSEPORT listener on one port (the kernel spreads
    connections); the parent only reserves the port, waits and forwards signals."""
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    reserve = socket.socket(family, socket.SOCK_STREAM)
    try:
        if args.port:
            # SO_REUSEPORT lets any process of this user join a port's listeners: a
            # second server would share the first one's connections (and answer from
            # its own database). A bind without it fails if anything listens there.
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((args.host, args.port))
        reserve.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        reserve.bind((args.host, args.port))  # bound, never listening: takes no connections
    except OSError as exc:
        reserve.close()
        print(f"berth placement serve: cannot listen: {exc}", file=sys.stderr)
        return 2
    port = reserve.getsockname()[1]
    ready_r, ready_w = os.pipe()
    children: list[int] = []
    for _ in range(args.workers):
        pid = os.fork()
        if pid == 0:  # child: serve until told to stop
            code = 1
            try:
                os.close(ready_r)
                server = _make_server(args, _listen(args.host, port, reuse_port=True))
                os.write(ready_w, b"1")
                os.close(ready_w)
                code = _run(server)
            finally:
                os._exit(code)
        children.append(pid)
    os.close(ready_w)
    started = 0
    while started < args.workers:
        chunk = os.read(ready_r, args.workers)
        if not chunk:
            break  # a child died before listening
        started += len(chunk)
    os.close(ready_r)

    def _forward(signum: int, _frame: Any) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)

    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    if started < args.workers:
        print("berth placement serve: a worker failed to start", file=sys.stderr)
        _forward(signal.SIGTERM, None)
    else:
        _announce(args, port)
    status = 0
    for child in children:
        _pid, code = os.waitpid(child, 0)
        status = status or os.waitstatus_to_exitcode(code)
    reserve.close()
    return status if started == args.workers else 2
