"""``berth serve`` and ``berth boot``: the resource store and scheduler as a service.

    berth serve [--db URL] [--host H] [--port N] [--cloud FILE] [--config-file nova.conf]
                [--threads N] [--seed N] [--no-resume]
                [--fail-host HOST ...] [--fail-first HOST=N ...] [--build-delay S]
                [--build-timeout S] [--reconcile-interval S]
    berth audit [--db URL] [--fix] [--json] [--build-timeout S]
    berth boot --flavor F [--num N] [--hint k=v ...] [--group G] [--image NAME] [--url URL]
               [--explain] [--json]
    berth migrate UUID [--host H] [--allow-cross-cell]   berth resize UUID --flavor F
    berth evacuate UUID [--host H]   berth rebuild UUID --image NAME
    berth live-migrate UUID [--host H]   berth drain HOST [--operation migrate]
    berth confirm-resize UUID   berth revert-resize UUID   berth server UUID

``serve`` opens (and migrates) the database — the embedded SQLite file
``./berth.sqlite`` by default, or any SQLAlchemy URL such as
``postgresql+psycopg://postgres@127.0.0.1:5432/test`` — and serves the scheduler API
(:mod:`berth.service.api`) with the Placement API under ``/placement``. With ``--cloud``
every host of the cloud file is registered through the compute-agent path (provider,
inventories, traits, aggregates, record) with its stats, ``io_workload`` and
``failed_builds``, its instances get their allocations, and the file's server groups
are stored; the agents then report every ``[DEFAULT] report_interval`` seconds.

A restart keeps what ran: an agent takes over the instances and usage of its host's
stored record, and the hosts an earlier run stored that the cloud file does not name
(all of them without ``--cloud``) get their agents back from their records, so they
keep reporting instead of going down after ``service_down_time``. ``--no-resume`` skips
the latter for a database whose hosts report from elsewhere. A cloud file that would
take a resource class away from a host whose allocations use it is refused before
anything is written.

``--fail-host`` and ``--fail-first`` tell the fake compute driver to fail builds, so the
conductor's rescheduling onto alternates can be watched; a host that is down (silent in
the file, or forced down) fails every build anyway. ``--build-delay`` makes every build
take that long (builds in flight, for crash tests).

Every ``serve`` runs a reconciler (:mod:`berth.service.reconcile`): its build heartbeat,
and the release of claims and group memberships of builds that a crashed process
abandoned ``--build-timeout`` seconds ago. ``audit`` (:mod:`berth.service.audit`) lists
and fixes what no build stands behind.

``migrate``, ``resize``, ``evacuate``, ``rebuild``, ``live-migrate``, ``confirm-resize``
and ``revert-resize`` post a move of an instance to ``/servers/{uuid}/...`` and print where
it went and what the instance and migration consumers hold; ``server`` shows one.

``boot`` posts to ``/boot`` and prints where each instance went (and, on a partial
failure, which instances were not built; exit status 6). ``--flavor`` is a flavor name
the server knows (the cloud file's, or m1.tiny ... m1.xlarge) or ``VCPUS,RAM_MB,DISK_GB``;
``--group`` names a server group (uuid or name), the same as ``--hint group=G``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import signal
import sys
from typing import TYPE_CHECKING, Any

from berth.errors import BerthError, InputError
from berth.model.request import MAX_INSTANCES_PER_REQUEST
from berth.placement.db import error_line, shown_url
from berth.service.reconcile import DEFAULT_BUILD_TIMEOUT
from berth.service.seeding import seed_loaded
from berth.webauth.options import add_arguments as add_security_arguments

if TYPE_CHECKING:
    from berth.explain import Diagnosis

DEFAULT_DB = "sqlite:///berth.sqlite"
DEFAULT_PORT = 8780
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"

LOG = logging.getLogger("berth.service")


def add_commands(subparsers: Any) -> None:
    """Register ``serve`` and ``boot`` on the ``berth`` command's subparsers."""
    p = subparsers.add_parser("serve", help="run the resource store and the scheduler API")
    p.add_argument("--db", default=DEFAULT_DB,
                   help=f"SQLAlchemy URL or SQLite path (default {DEFAULT_DB})")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                   help=f"port, 0-65535, 0 for any free one (default {DEFAULT_PORT})")
    p.add_argument("--cloud", help="cloud file whose hosts are registered at start-up")
    p.add_argument("--config-file", action="append", help="nova.conf (repeatable)")
    p.add_argument("--threads", type=thread_count, default=8, help="server threads (default 8)")
    p.add_argument("--seed", type=int, default=None, help="random seed of the scheduler")
    add_security_arguments(p)
    p.add_argument("--no-resume", action="store_true",
                   help="do not re-create agents for the hosts stored by an earlier run (for "
                        "a database whose hosts report from elsewhere); they go down after "
                        "service_down_time unless something reports for them")
    p.add_argument("--fail-host", action="append", default=[], metavar="HOST",
                   help="the fake driver fails every build on HOST (repeatable): the "
                        "conductor reschedules onto the alternates")
    p.add_argument("--fail-first", action="append", default=[], type=host_count,
                   metavar="HOST=N", help="the fake driver fails the first N builds on HOST "
                                          "(repeatable)")
    p.add_argument("--build-delay", type=seconds, default=0.0, metavar="SECONDS",
                   help="the fake driver takes this long per build (builds in flight, for "
                        "crash tests and demos)")
    p.add_argument("--build-timeout", type=positive_seconds, default=DEFAULT_BUILD_TIMEOUT,
                   metavar="SECONDS",
                   help="a build not updated for this long was abandoned by a crashed "
                        "process: its claims and group membership are released "
                        f"(default {DEFAULT_BUILD_TIMEOUT:g})")
    p.add_argument("--reconcile-interval", type=positive_seconds, default=None,
                   metavar="SECONDS",
                   help="seconds between heartbeats and reconciliation rounds (default "
                        "the smaller of 10 and a quarter of --build-timeout)")
    p.set_defaults(func=cmd_serve)

    from berth.service.audit import add_command as add_audit

    add_audit(subparsers, DEFAULT_DB, positive_seconds)

    b = subparsers.add_parser("boot", help="ask a running 'berth serve' to place instances")
    b.add_argument("--flavor", required=True, help="flavor name, or VCPUS,RAM_MB,DISK_GB")
    b.add_argument("--num", type=instance_count, default=1,
                   help="number of instances (default 1, at most "
                        f"{MAX_INSTANCES_PER_REQUEST})")
    b.add_argument("--hint", action="append", default=[], metavar="KEY=VALUE",
                   help="scheduler hint; repeat a key for a list")
    b.add_argument("--group", help="server group (name or uuid) the instances join; the "
                                   "same as --hint group=GROUP")
    b.add_argument("--image", help="image name known to the server")
    b.add_argument("--availability-zone", "--az", dest="availability_zone")
    b.add_argument("--project", default=None,
                   help="project booted for (default the token's; another project needs "
                        "the admin or service role)")
    b.add_argument("--user", default=None, help="user booted for (default the token's)")
    b.add_argument("--url", default=DEFAULT_URL, type=server_url,
                   help=f"server URL (default {DEFAULT_URL})")
    b.add_argument("--token", help="token for the server (default OS_AUTH_TOKEN, else one from Keystone with "
                        "OS_AUTH_URL, OS_USERNAME, ...; else noauth2's 'admin')")
    b.add_argument("--explain", action="store_true",
                   help="ask for the diagnosis (filters, rejections, weights) and print it "
                        "as 'berth schedule --explain' does, also when no host is valid")
    b.add_argument("--verbose", "-v", action="store_true",
                   help="with --explain: every rejected host and every weigher's term")
    b.add_argument("--json", action="store_true",
                   help="print the JSON answer as the server sent it (errors too)")
    b.set_defaults(func=cmd_boot)

    # Moves of an instance the server knows (booted through it, or from its cloud file).
    actions = (
        ("migrate", "cold-migrate an instance (its host ignored) through a running 'berth serve'"),
        ("resize", "resize an instance to another flavor"),
        ("evacuate", "rebuild an instance of a host that is down on another host"),
        ("rebuild", "rebuild an instance on its own host with another image"),
        ("live-migrate", "live-migrate an instance to another host of its cell (no confirm "
                         "step)"),
        ("confirm-resize", "confirm a migration or resize: the source allocation goes"),
        ("revert-resize", "revert a migration or resize: back to the source and old flavor"),
        ("server", "show an instance: host, status, migrations, allocations"),
        ("delete", "delete an instance: its allocations go, its host forgets it"),
    )
    for name, text in actions:
        m = subparsers.add_parser(name, help=text)
        m.add_argument("instance", metavar="INSTANCE_UUID", type=instance_uuid)
        if name in ("migrate", "evacuate", "live-migrate"):
            m.add_argument("--host", help="the requested destination host")
        if name in ("migrate", "resize"):
            m.add_argument("--allow-cross-cell", action="store_true",
                           help="the instance may leave its cell (Nova's policy rule "
                                "compute:servers:resize:cross_cell)")
        if name == "resize":
            m.add_argument("--flavor", required=True,
                           help="flavor name, or VCPUS,RAM_MB,DISK_GB")
        if name == "rebuild":
            m.add_argument("--image", required=True, help="image name known to the server")
        if name in ("migrate", "resize", "evacuate", "rebuild", "live-migrate"):
            m.add_argument("--explain", action="store_true",
                           help="print the diagnosis, as 'berth boot --explain' does")
            m.add_argument("--verbose", "-v", action="store_true",
                           help="with --explain: every rejected host and every weigher's term")
        m.add_argument("--url", default=DEFAULT_URL, type=server_url,
                       help=f"server URL (default {DEFAULT_URL})")
        m.add_argument("--token", help="token for the server (default OS_AUTH_TOKEN, else one from Keystone with "
                            "OS_AUTH_URL, OS_USERNAME, ...; else noauth2's 'admin')")
        m.add_argument("--json", action="store_true", help="print the JSON answer as sent")
        m.set_defaults(func=cmd_server_action, action=name)
    d = subparsers.add_parser("drain", help="move every instance off a compute host, one "
                                            "after another, through a running 'berth serve'")
    d.add_argument("host", type=host_name, help="the compute host to empty")
    d.add_argument("--operation", choices=("live-migrate", "migrate"), default="live-migrate",
                   help="live-migrate (default) or cold-migrate (confirmed at once) each")
    d.add_argument("--url", default=DEFAULT_URL, type=server_url,
                   help=f"server URL (default {DEFAULT_URL})")
    d.add_argument("--token", help="token for the server (as for 'berth migrate')")
    d.add_argument("--json", action="store_true", help="print the JSON answer as sent")
    d.set_defaults(func=cmd_drain)
    from berth.service import services_cli

    services_cli.add_commands(subparsers, DEFAULT_URL)


def instance_uuid(text: str) -> str:
    """An argparse type: an instance's uuid (it goes into the URL's path: nothing else
    may, or it could name another route)."""
    import uuid as uuidlib

    try:
        return str(uuidlib.UUID(text))  # as the server keeps it: lower case, dashes
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an instance uuid, got {text!r}") from None


def host_name(text: str) -> str:
    """An argparse type: a compute host's name, as one segment of a URL's path."""
    if not text or text in (".", "..") or "/" in text or not text.isprintable():
        raise argparse.ArgumentTypeError(f"expected a host name, got {text!r}")
    return text


def server_url(text: str) -> str:
    """An argparse type: the http(s) URL of a running server."""
    import httpx

    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise argparse.ArgumentTypeError(f"not a URL: {text!r} ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL with a host, "
                                         f"got {text!r}")
    if url.port is not None and not 0 < url.port < 65536:
        raise argparse.ArgumentTypeError(f"port {url.port} of {text!r} is not a TCP port")
    return text


def url_segment(text: str) -> str:
    """``text`` quoted as one segment of a URL's path."""
    from urllib.parse import quote

    return quote(text, safe="")


def instant(text: str) -> float:
    """An argparse type: an instant, epoch seconds (a finite number)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected epoch seconds, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected epoch seconds, got {text!r}")
    return value


#: The longest interval, timeout or delay an option takes (about 115 days): past it a
#: typo overflows the clock's arithmetic (1e12 s killed the reconciler's thread).
MAX_SECONDS = 10_000_000
#: The most threads a server takes (``--threads``).
MAX_THREADS = 1024


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_SECONDS:,} seconds, got "
                                         f"{text!r}")
    return value


def thread_count(text: str) -> int:
    """An argparse type: a number of server threads, 1 to :data:`MAX_THREADS`."""
    value = positive_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_THREADS} threads, got {value}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0."""
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def instance_count(text: str) -> int:
    """An argparse type: a number of instances, 1 to the request bound."""
    value = positive_int(text)
    if value > MAX_INSTANCES_PER_REQUEST:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_INSTANCES_PER_REQUEST} instances per request, got {value}")
    return value


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0-65535 (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {value}")
    return value


def host_count(text: str) -> tuple[str, int]:
    """An argparse type: ``HOST=N`` with N >= 1."""
    host, sep, count = text.partition("=")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST=N, got {text!r}")
    try:
        return host, positive_int(count)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected HOST=N with N a positive integer, got {text!r}") from None


# ----------------------------------------------------------------------------- boot
def flavor_argument(text: str) -> Any:
    """``--flavor``: a name, or ``VCPUS,RAM_MB,DISK_GB`` as an inline flavor."""
    parts = text.split(",")
    if len(parts) == 1:
        return text
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise InputError(f"--flavor {text!r}: expected a name or VCPUS,RAM_MB,DISK_GB")
    vcpus, ram, disk = (int(p) for p in parts)
    return {"name": text, "vcpus": vcpus, "memory_mb": ram, "root_gb": disk}


def _hints(pairs: list[str]) -> dict[str, list[str]]:
    hints: dict[str, list[str]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--hint {pair!r}: expected key=value")
        hints.setdefault(key, []).append(value)
    return hints


def cmd_boot(args: argparse.Namespace) -> int:
    """POST /boot and print the placements."""

    hints = _hints(args.hint)
    if args.group:
        if hints.get("group", [args.group]) != [args.group]:
            raise InputError(f"--group {args.group!r} and --hint group={hints['group'][0]!r} "
                             "disagree; give one")
        hints["group"] = [args.group]
    body: dict[str, Any] = {"flavor": flavor_argument(args.flavor), "num": args.num,
                            "hints": hints}
    if args.project:
        body["project_id"] = args.project
    if args.user:
        body["user_id"] = args.user
    if args.image:
        body["image"] = args.image
    if args.availability_zone:
        body["availability_zone"] = args.availability_zone
    if args.explain:
        body["explain"] = True
    sent = ask_server(args, "POST", args.url.rstrip("/") + "/boot", json=body)
    if isinstance(sent, int):
        return sent
    resp, data = sent
    verbose = bool(getattr(args, "verbose", False))
    if data.get("instances"):
        # Also in a 409 that built some of the instances: those exist.
        _print_instances(data["instances"])
    for failed in data.get("failed") or []:
        err = failed.get("error", {})
        print(f"instance {failed.get('instance_uuid')} not built (tried "
              f"{','.join(failed.get('tried') or []) or 'no host'}): {err.get('message')}",
              file=sys.stderr)
    if resp.status_code != 200:
        status = refused(resp, data)
        err = data.get("error", {})
        if err.get("instances_requested"):
            print(f"  {err.get('instances_fit')} of {err['instances_requested']} instances found "
                  "a host before the hosts ran out (their claims were released)",
                  file=sys.stderr)
        if data.get("diagnosis"):
            _print_diagnosis(data["diagnosis"], verbose)
        return status
    if data.get("diagnosis"):
        print()
        _print_diagnosis(data["diagnosis"], verbose)
    return 0


def cmd_server_action(args: argparse.Namespace) -> int:
    """POST a move (or confirm/revert) to ``/servers/{uuid}/{action}``, or GET the
    instance, and print where it is and what its consumers hold."""

    url = f"{args.url.rstrip('/')}/servers/{url_segment(args.instance)}"
    body: dict[str, Any] = {}
    if getattr(args, "host", None):
        body["host"] = args.host
    if getattr(args, "allow_cross_cell", False):
        body["allow_cross_cell"] = True
    if getattr(args, "flavor", None):
        body["flavor"] = flavor_argument(args.flavor)
    if getattr(args, "image", None):
        body["image"] = args.image
    if getattr(args, "explain", False):
        body["explain"] = True
    if args.action == "server":
        sent = ask_server(args, "GET", url)
    elif args.action == "delete":
        sent = ask_server(args, "DELETE", url)
    else:
        sent = ask_server(args, "POST", f"{url}/{args.action}", json=body)
    if isinstance(sent, int):
        return sent
    resp, data = sent
    verbose = bool(getattr(args, "verbose", False))
    if resp.status_code != 200:
        status = refused(resp, data)
        if data.get("diagnosis"):
            _print_diagnosis(data["diagnosis"], verbose)
        return status
    _print_server(args.action, data)
    if data.get("diagnosis"):
        print()
        _print_diagnosis(data["diagnosis"], verbose)
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    """POST ``/hosts/{host}/drain`` and print where each instance went (exit 4 when
    some stay on the host)."""
    from berth.service.drain import drain_lines

    url = f"{args.url.rstrip('/')}/hosts/{url_segment(args.host)}/drain"
    sent = ask_server(args, "POST", url, json={"operation": args.operation})
    if isinstance(sent, int):
        return sent
    resp, data = sent
    if resp.status_code not in (200, 409) or "moved" not in data:
        return refused(resp, data)
    print("\n".join(drain_lines(data)))
    return 0 if resp.status_code == 200 else 4


def _print_server(action: str, data: dict[str, Any]) -> None:
    """Where the instance is (and came from), its status, and each consumer's
    allocations by provider."""
    if action == "delete":
        names = data.get("providers") or {}
        print(f"{data['instance_uuid']}: deleted from {data['host']} ({data['nodename']})")
        for consumer, held in (data.get("freed") or {}).items():
            text = "; ".join(f"{names.get(rp, rp)} " + ", ".join(
                f"{rc}={n}" for rc, n in sorted(res.items()))
                for rp, res in sorted(held.items())) or "nothing"
            print(f"  freed from consumer {consumer}: {text}")
        return
    source = data.get("source")
    if source and action != "server":
        tried = ",".join(data.get("tried") or []) or "-"
        alternates = ",".join(a["host"] for a in data.get("alternates") or []) or "-"
        print(f"{action}: {data['instance_uuid']} {source['host']} -> {data['host']} "
              f"({data['nodename']}); status {data.get('status')}; tried {tried}; "
              f"alternates {alternates}")
        for skip in data.get("skipped") or []:
            print(f"  skipped {skip['host']}: {skip['reason']}")
    else:
        print(f"{data['instance_uuid']}: on {data['host']} ({data['nodename']}); status "
              f"{data.get('status')}" + (f"; flavor {data['flavor']}" if data.get("flavor") else ""))
    allocations = data.get("allocations") or {}
    for consumer, label in (("instance", data["instance_uuid"]),
                            ("migration", data.get("migration_uuid"))):
        if consumer not in allocations:
            continue
        held = allocations[consumer]
        names = data.get("providers") or {}
        text = "; ".join(f"{names.get(rp, rp)} " + ", ".join(
            f"{rc}={n}" for rc, n in sorted(res.items()))
            for rp, res in sorted(held.items())) or "nothing"
        print(f"  {consumer} consumer {label}: {text}")
    if action == "server":
        for m in data.get("migrations") or []:
            print(f"  migration {m['uuid']}: {m['migration_type']} {m['source_host']} -> "
                  f"{m['dest_host'] or '-'}, {m['status']}")


def _print_instances(instances: list[dict[str, Any]]) -> None:
    """One row per built instance: where it went, the hosts tried, its alternates."""
    rows = [("#", "instance", "host", "node", "tried", "alternates")]
    for i, inst in enumerate(instances, start=1):
        rows.append((str(i), inst["instance_uuid"], inst["host"], inst["nodename"],
                     ",".join(inst["tried"]),
                     ",".join(a["host"] for a in inst["alternates"]) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def _auth_headers(args: argparse.Namespace) -> dict[str, str]:
    from berth.webauth.client import cli_token

    return {"X-Auth-Token": cli_token(args.token)}


def ask_server(args: argparse.Namespace, method: str, url: str, *, json: Any = None,
               empty_ok: bool = False) -> tuple[Any, dict[str, Any]] | int:
    """Send one request to a running server (``args.token``'s token) and read its
    answer: the response and its JSON object, or the exit status once dealt with (7
    when the server cannot be reached; see :func:`answer_of`). With ``empty_ok``, a
    204 is an empty object."""
    import httpx

    try:
        resp = httpx.request(method, url, json=json, timeout=60, headers=_auth_headers(args))
    except httpx.HTTPError as exc:
        print(f"error: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 7
    if empty_ok and resp.status_code == 204:
        return resp, {}
    data = answer_of(resp, args)
    return data if isinstance(data, int) else (resp, data)


def answer_of(resp: Any, args: argparse.Namespace) -> dict[str, Any] | int:
    """The JSON object a server answered, or the exit status once the answer is dealt
    with: 1 for one that is not a JSON object; with ``--json``, the answer printed as
    sent (errors and their diagnosis included)."""
    try:
        data = resp.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        print(f"error: {resp.status_code} from {args.url}: {resp.text[:200]}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2))
        return 0 if resp.status_code == 200 else _exit_code(resp.status_code, data)
    return data


def refused(resp: Any, data: dict[str, Any]) -> int:
    """Print a refusal's message and code; its exit status."""
    err = data.get("error", {})
    print(f"error: {err.get('message', resp.text)} ({err.get('code', resp.status_code)})",
          file=sys.stderr)
    return _exit_code(resp.status_code, data)


def _exit_code(status: int, data: Any) -> int:
    """The exit status ``berth schedule`` gives the same error (by its code), else 9 for a
    refused token or a policy refusal, 3 for a bad request, 7 for a route this server
    does not serve (a move asked of ``berth api``) and 4 for another refusal."""
    from berth.errors import EXIT_CODES

    if status in (401, 403):
        return 9
    code = data.get("error", {}).get("code") if isinstance(data, dict) else None
    for cls, exit_status in EXIT_CODES.items():
        if cls.code == code:
            return exit_status
    if status == 400:
        return 3
    return 7 if code == "berth.http.not_found" else 4


def diagnosis_from_dict(data: Any) -> Diagnosis:
    """The :class:`~berth.explain.Diagnosis` of an API answer's ``"diagnosis"`` (the
    inverse of ``Diagnosis.to_dict``), so it prints as ``berth schedule --explain``."""
    from berth.explain import (
        Diagnosis,
        FilterStep,
        HostRejection,
        HostWeighing,
        InstanceDiagnosis,
        WeigherTerm,
    )
    from berth.filters.base import Reject

    if not isinstance(data, dict) or not isinstance(data.get("instances"), list):
        raise InputError("diagnosis: expected an object with a list of instances")
    instances: list[InstanceDiagnosis] = []
    for item in data["instances"]:
        chosen = item.get("chosen")
        steps = [
            FilterStep(
                name=s["name"], hosts_in=int(s["hosts_in"]), hosts_out=int(s["hosts_out"]),
                skipped=s.get("skipped"),
                rejections=[HostRejection(r["host"], r["nodename"], s["name"],
                                          Reject(r["reason"], dict(r.get("numbers") or {})))
                            for r in s.get("rejections") or []],
            )
            for s in item.get("steps") or []
        ]
        weighing = [
            HostWeighing(w["host"], w["nodename"], float(w["weight"]), [
                WeigherTerm(t["weigher"], float(t["raw"]), float(t["normalized"]),
                            float(t["multiplier"]))
                for t in w.get("terms") or []])
            for w in item.get("weighing") or []
        ]
        instances.append(InstanceDiagnosis(
            index=int(item.get("index", len(instances))), instance_uuid=item.get("instance_uuid"),
            hosts_considered=int(item.get("hosts_considered", 0)), steps=steps,
            weighing=weighing, chosen=(chosen[0], chosen[1]) if chosen else None,
            claim_failures=[(c[0], c[1], c[2] if len(c) > 2 else None)
                            for c in item.get("claim_failures") or []],
            ranked_by="cost" if item.get("ranked_by") == "cost" else "weight",
            random_pick=_random_pick(item.get("random_pick")),
        ))
    return Diagnosis(instances)


def _random_pick(data: Any) -> Any:
    from berth.explain import RandomPick

    if not isinstance(data, dict):
        return None
    best = data.get("best") or ["?", "?"]
    return RandomPick(among=int(data.get("among", 0)),
                      subset_size=int(data.get("host_subset_size", 1)),
                      best=(str(best[0]), str(best[1])),
                      best_weight=float(data.get("best_weight", 0.0)),
                      picked_weight=float(data.get("picked_weight", 0.0)))


def _print_diagnosis(data: Any, verbose: bool) -> None:
    """Print an API diagnosis the way ``berth schedule --explain`` prints its own."""
    from berth.explain import diagnosis_lines

    try:
        diagnosis = diagnosis_from_dict(data)
    except (InputError, KeyError, TypeError, ValueError, IndexError):
        # A server of another version: show what it sent rather than nothing.
        print(json.dumps(data, indent=2))
        return
    print("\n".join(diagnosis_lines(diagnosis, verbose=verbose)))


# ----------------------------------------------------------------------------- serve
def cmd_serve(args: argparse.Namespace) -> int:
    """Run the store and the scheduler API until SIGTERM/SIGINT.

    Start-up order: configuration, the listening socket (a port in use or a bad address
    fails before the database is touched), the database, the cloud file's hosts, then
    agents for the hosts an earlier run stored (unless ``--no-resume``). Every start-up
    problem is one line on stderr and exit status 2 (3 for a bad cloud file).
    """
    from waitress.server import create_server

    from berth.config import SchedulerConfig
    from berth.placement.cli import DEFAULT_CHANNEL_TIMEOUT, DEFAULT_MAX_BODY
    from berth.service.api import DEFAULT_FLAVORS, SchedulerApp
    from berth.service.conductor import FakeDriver
    from berth.service.metrics import configure_logging
    from berth.service.stack import open_stack

    # ``berth`` configured logging at WARNING already; serve logs at INFO, each line with
    # the request id of the request it belongs to.
    configure_logging()
    for chatty in ("alembic", "httpx"):  # migrations, and every in-process placement call
        logging.getLogger(chatty).setLevel(logging.WARNING)
    config = SchedulerConfig.from_files(args.config_file) if args.config_file else SchedulerConfig.default()
    from berth.service.policy import api_security

    try:
        args.security = api_security(args)
    except BerthError as exc:
        print(f"berth serve: {exc}", file=sys.stderr)
        return 2
    apps: list[Any] = []

    def application(environ: dict[str, Any], start_response: Any) -> Any:
        return apps[0](environ, start_response)

    try:
        server: Any = create_server(application, host=args.host, port=args.port,
                                    threads=args.threads, ident="berth",
                                    clear_untrusted_proxy_headers=True,
                                    max_request_body_size=DEFAULT_MAX_BODY,
                                    channel_timeout=DEFAULT_CHANNEL_TIMEOUT)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        print(f"berth serve: cannot listen on --host {args.host!r} --port {args.port}: {reason}",
              file=sys.stderr)
        return 2
    try:
        try:
            stack = open_stack(args.db, config, security=args.security[1])
        except Exception as exc:  # start-up problems are reported, not traced
            print(f"berth serve: cannot open database {shown_url(args.db)!r}: {error_line(exc)}", file=sys.stderr)
            return 2
        try:
            return _serve(args, server, apps, stack, DEFAULT_FLAVORS, SchedulerApp, FakeDriver)
        finally:
            stack.close()
    finally:
        server.close()


def _unknown_fail_host(fail_hosts: list[str], fail_first: dict[str, int],
                       known: set[str]) -> bool:
    """Say (on stderr) which ``--fail-host`` / ``--fail-first`` host is not among
    ``known``; True when one is not."""
    for option, host in [("--fail-host", h) for h in fail_hosts] + [
            ("--fail-first", h) for h in fail_first]:
        if host not in known:
            print(f"berth serve: {option} {host}: no compute host {host!r} (known: "
                  f"{', '.join(sorted(known)) or 'none'})", file=sys.stderr)
            return True
    return False


def _serve(args: argparse.Namespace, server: Any, apps: list[Any], stack: Any,
           default_flavors: dict[str, Any], app_class: Any, driver_class: Any) -> int:
    """Register the hosts, wire the app behind ``server`` and run it."""
    import time

    from berth.cloudfile import load_cloud
    from berth.service.compute import agent_key
    from berth.service.metrics import (
        Metrics,
        claims_collector,
        hosts_collector,
        instrument,
        queue_collector,
    )
    from berth.service.reporting import Reporter
    from berth.service.services_api import ServiceAdmin

    flavors: dict[str, Any] = dict(default_flavors)
    images: dict[str, Any] = {}
    now = time.time()
    cloud = load_cloud(args.cloud, stack.config, now=now) if args.cloud else None
    fail_first = dict(args.fail_first)
    if args.fail_host or fail_first:
        # Refused before the file's hosts are stored: a mistyped option changes nothing.
        named = {str(h) for h in cloud.snapshot.obj("host")} if cloud is not None else set()
        if not args.no_resume:
            named |= {str(r["host"]) for r in stack.records.reports()}
        if _unknown_fail_host(args.fail_host, fail_first, named):
            return 2
    if cloud is not None:
        cloud_flavors, images = seed_loaded(stack, cloud, args.cloud, now=now)
        flavors = cloud_flavors
        LOG.info("registered %d compute nodes from %s", len(stack.agents), args.cloud)
    stored: set[str] = set()  # hosts stored and reporting (or not) from elsewhere
    if not args.no_resume:
        resumed = stack.resume_agents()
        if resumed:
            names = [a.node.host for a in resumed]
            LOG.info("resumed %d compute nodes stored by an earlier run: %s%s", len(names),
                     ", ".join(names[:10]), ", ..." if len(names) > 10 else "")
    else:
        stored = {agent_key(r["host"], r.get("nodename"))
                  for r in stack.records.reports()} - set(stack.agents)
        if stored:
            LOG.warning("%d stored hosts have no agent here (--no-resume): they go down "
                        "after service_down_time unless they report from elsewhere",
                        len(stored))
    if not stack.agents and not stored:
        LOG.warning("no compute hosts: every boot fails with NoValidHost until hosts "
                    "register (start with --cloud FILE)")
    if _unknown_fail_host(args.fail_host, fail_first,
                          {agent.node.host for agent in stack.agents.values()}):
        return 2
    driver = driver_class(fail_hosts=set(args.fail_host), fail_first=fail_first,
                          agents=stack.agents, delay=args.build_delay)
    # The agents' periodic reports, from one thread (see berth.service.reporting).
    reporter = Reporter(lambda: list(stack.agents.values()), stack.records)
    reporter.start(float(stack.config.report_interval))
    service = stack.scheduler(seed=args.seed)
    service.warm()
    conductor = stack.conductor(service, driver)
    moves = stack.moves(conductor)
    # A compute that starts drops the instances evacuated from it (Nova's init_host).
    up = {agent.node.host for agent in stack.agents.values() if not agent.down}
    for host in sorted(moves.evacuated_sources() & up):
        cleaned = moves.cleanup_evacuated(host)
        if cleaned:
            LOG.info("compute %s is up: released %d instances evacuated from it",
                     host, len(cleaned))
    metrics = Metrics()
    service.observers.append(metrics.observe_decision)
    metrics.add(claims_collector(service.claimer.stats))
    metrics.add(hosts_collector(service))
    metrics.add(queue_collector(server))
    security = args.security[0]
    services = ServiceAdmin(driver=driver, placement=stack.client, records=stack.records)
    app = app_class(service, conductor, stack.placement_app, flavors, images,
                    groups=stack.groups, moves=moves, security=security, services=services)
    apps.append(instrument(security.identity.wrap(app), metrics, "scheduler"))
    app.served_app = apps[-1]  # the web view's capacity report reads the cloud through it
    LOG.info("scheduler and placement APIs: %s", security.describe())
    reconciler = stack.reconciler(timeout=args.build_timeout, interval=args.reconcile_interval)
    reconciler.start()

    def _stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"listening on http://{args.host}:{server.effective_port} (db {args.db}; "
          f"placement under /placement)", flush=True)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
    finally:
        reconciler.stop()
        reporter.stop()
    return 0
