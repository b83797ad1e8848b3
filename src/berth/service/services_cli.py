"""``berth service list|set``: the compute services of a running ``berth serve`` or
``berth api`` (``/os-services``), and an operator's switches on them, as
``openstack compute service list|set`` does for Nova.

    berth service list
    berth service set c1-s01 --disable --disable-reason "new disks"
    berth service set c1-s01 --enable
    berth service set c1-s01 --down          # forced down: evacuate its instances now
    berth service set c1-s01 --up
    berth service delete c1-s01              # a host taken out of the cloud
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_commands(subparsers: Any, default_url: str) -> None:
    """Register ``service list`` and ``service set`` on the ``berth`` subparsers."""
    from berth.service.cli import host_name, server_url

    service = subparsers.add_parser(
        "service", help="the compute services of a running 'berth serve' or 'berth api': "
                        "list them, disable, enable or force one down")
    actions = service.add_subparsers(dest="action", required=True)
    listed = actions.add_parser("list", help="every compute service: zone, status, state")
    changed = actions.add_parser("set", help="disable/enable a host's compute service, or "
                                             "force it down/up (Nova's os-services update)")
    changed.add_argument("host", metavar="HOST", type=host_name)
    status = changed.add_mutually_exclusive_group()
    status.add_argument("--disable", dest="status", action="store_const", const="disabled",
                        help="schedule nothing more on it (ComputeFilter; the "
                             "COMPUTE_STATUS_DISABLED trait)")
    status.add_argument("--enable", dest="status", action="store_const", const="enabled",
                        help="schedule on it again (clears the reason)")
    changed.add_argument("--disable-reason", metavar="TEXT",
                         help="why (with --disable; at most 255 characters)")
    forced = changed.add_mutually_exclusive_group()
    forced.add_argument("--down", dest="forced_down", action="store_const", const=True,
                        help="force it down whatever its heartbeat (its instances may be "
                             "evacuated at once)")
    forced.add_argument("--up", dest="forced_down", action="store_const", const=False,
                        help="no longer forced down")
    deleted = actions.add_parser(
        "delete", help="delete a host's compute service (it runs no instance): its agents "
                       "stop, its resource providers and records go")
    deleted.add_argument("host", metavar="HOST", type=host_name)
    for p in (listed, changed, deleted):
        p.add_argument("--url", default=default_url, type=server_url,
                       help=f"server URL (default {default_url})")
        p.add_argument("--token", help="token for the server (default OS_AUTH_TOKEN, else "
                                       "one from Keystone with OS_AUTH_URL, OS_USERNAME, ...; "
                                       "else noauth2's 'admin')")
        p.add_argument("--json", action="store_true", help="print the JSON answer as sent")
    for p in (listed, changed, deleted):
        p.set_defaults(func=cmd_service)


def cmd_service(args: argparse.Namespace) -> int:
    """GET, PUT or DELETE ``/os-services`` and print the services as a table."""
    from berth.service.cli import ask_server, refused, url_segment

    base = f"{args.url.rstrip('/')}/os-services"
    if args.action == "list":
        sent = ask_server(args, "GET", base)
    elif args.action == "delete":
        sent = ask_server(args, "DELETE", f"{base}/{url_segment(args.host)}", empty_ok=True)
    else:
        if args.status is None and args.forced_down is None:
            print("berth service set: give --disable/--enable, --down/--up or both",
                  file=sys.stderr)
            return 2
        body: dict[str, Any] = {}
        if args.status is not None:
            body["status"] = args.status
        if args.disable_reason is not None:
            body["disabled_reason"] = args.disable_reason
        if args.forced_down is not None:
            body["forced_down"] = args.forced_down
        sent = ask_server(args, "PUT", f"{base}/{url_segment(args.host)}", json=body)
    if isinstance(sent, int):
        return sent
    resp, data = sent
    if resp.status_code != 200 and resp.status_code != 204:
        return refused(resp, data)
    if args.action == "delete":
        print(f"deleted the compute service of {args.host}")
        return 0
    services = data["services"] if "services" in data else [data["service"]]
    print_services(services)
    return 0


def print_services(services: list[dict[str, Any]]) -> None:
    """One row per service, as ``openstack compute service list`` prints them."""
    rows = [("Host", "Zone", "Status", "State", "Forced Down", "Updated At", "Nodes",
             "Disabled Reason")]
    for s in services:
        nodes = s.get("nodes") or []
        rows.append((s["host"], str(s.get("zone") or "-"), s["status"], s["state"],
                     "yes" if s.get("forced_down") else "no", s.get("updated_at") or "-",
                     str(len(nodes)),
                     s.get("disabled_reason") or ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
