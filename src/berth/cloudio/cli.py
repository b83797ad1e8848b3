"""``berth cloud import`` and ``berth cloud export``: write a running cloud as a cloud file.

    berth cloud import [--os-cloud NAME] [-o FILE] [--format yaml|json] [--config-file F]
    berth cloud export [--url URL] [--token T] [-o FILE] [--format yaml|json] [--config-file F]

Warnings (bad or unusable data, each naming its object) go to stderr, one line each,
then a summary line; the file goes to ``--output`` (stdout by default).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def add_commands(cloud: Any) -> None:
    """Register ``import`` and ``export`` on the ``berth cloud`` subparsers."""
    from berth.service.cli import server_url

    c = cloud.add_parser("import", help="write a real OpenStack cloud as a cloud file "
                                        "(openstacksdk: clouds.yaml or OS_* variables)")
    c.add_argument("--os-cloud", metavar="NAME",
                   help="cloud in clouds.yaml (default: the OS_CLOUD variable, else the "
                        "OS_* variables)")
    _output_options(c)
    c.set_defaults(func=cmd_import)

    c = cloud.add_parser("export", help="write the state of a running 'berth serve' as a "
                                        "cloud file")
    c.add_argument("--url", default="http://127.0.0.1:8780", type=server_url,
                   help="the server (default http://127.0.0.1:8780)")
    c.add_argument("--token", default="admin",
                   help="token for its Placement API (noauth2: 'admin' by default)")
    _output_options(c)
    c.set_defaults(func=cmd_export)


def _output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", default="-",
                   help="file to write (default: stdout); .json writes JSON")
    p.add_argument("--format", choices=("yaml", "json"),
                   help="file format (default: by the file's extension, else YAML)")
    p.add_argument("--config-file", action="append",
                   help="nova.conf the file is scheduled with (reserved_host_* options)")


def cmd_import(args: argparse.Namespace) -> int:
    """Read an OpenStack cloud and write it as a cloud file."""
    import os

    from berth.cloudio.openstack import OpenStackAPI, read_openstack

    api = OpenStackAPI.connect(args.os_cloud or os.environ.get("OS_CLOUD") or None)
    return _write(read_openstack(api), args, f"berth cloud import of {api.name}")


def cmd_export(args: argparse.Namespace) -> int:
    """Read a running Berth and write it as a cloud file."""
    from berth.cloudio.berth_source import BerthAPI, read_berth

    api = BerthAPI(args.url, token=args.token)
    try:
        state = read_berth(api)
    finally:
        api.close()
    return _write(state, args, f"berth cloud export of {args.url}")


def _write(state: Any, args: argparse.Namespace, what: str) -> int:
    from berth.cli import _load_config
    from berth.cloudio.emit import dump, to_document

    doc = to_document(state, _load_config(args.config_file))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    dump(doc, args.output, args.format, header=f"{what} at {stamp}\nSchema: docs/cloud-file.md")
    for line in state.warnings:
        print(f"warning: {line}", file=sys.stderr)
    where = "stdout" if args.output == "-" else args.output
    print(f"wrote {where}: {len(doc['hosts'])} compute nodes, "
          f"{len(doc.get('aggregates', []))} aggregates, {len(doc.get('flavors', []))} flavors, "
          f"{len(doc.get('images', []))} images, {len(doc.get('server_groups', []))} server "
          f"groups, {sum(len(h.get('instances', [])) for h in doc['hosts'])} instances"
          f" ({len(state.warnings)} warning(s))", file=sys.stderr)
    return 0
