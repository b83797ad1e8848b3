"""``berth simulate`` and ``berth trace generate``.

    berth simulate CLOUD TRACE [--config-file A.conf ...] [--compare B.conf ...]
                   [--out DIR] [--json FILE|-] [--plots DIR] [--html FILE]
                   [--samples N] [--seed N] [--now T] [--limit N] [--progress] [--jobs N]
                   [--azure-machine VCPUS,MEMORY_MB,DISK_GB] [--azure-machine-id N]
    berth simulate --url URL TRACE [--token T] ...
    berth trace generate --creates N --rate R --lifetime exp:3600
                   (--flavor-mix m1.small=3,m1.large=1 | --cloud CLOUD) [--group-fraction F]
                   [--groups N] [--group-policy P] [--image NAME] [--duration S] [--seed N]
                   -o FILE

``simulate`` replays the trace against the cloud file once per configuration: the
``--config-file`` files (Nova's defaults without any), then each ``--compare`` file on
its own. Each replay starts from the cloud file as it is, in its own scratch store;
several configurations replay side by side, one process each (:mod:`berth.simulate.jobs`).
With ``--url`` the trace is replayed against a running Berth instead (one
configuration: the server's); what it builds stays there.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from berth.errors import CloudFileError, InputError
from berth.simulate.generate import MAX_CREATES
from berth.simulate.trace import AzureMachine, events_at_most

#: The most instants ``--samples`` may ask for: each one reads the whole ledger (its
#: fragmentation too), so a count far past the trace's events only costs time.
MAX_SAMPLES = 100_000


def samples_count(text: str) -> int:
    """An argparse type: ``--samples``, an integer from 1 to :data:`MAX_SAMPLES`."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_SAMPLES:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to {MAX_SAMPLES:,}, "
                                         f"got {text!r}")
    return value


def azure_machine(text: str) -> AzureMachine:
    """An argparse type: ``--azure-machine`` (argparse reports its error as its own)."""
    try:
        return AzureMachine.parse(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(exc.message.removeprefix("--azure-machine: ")) from None


def add_commands(sub: Any) -> None:
    """Register ``simulate`` and ``trace`` on the ``berth`` command's subparsers."""
    from berth.service.cli import instant, positive_int, server_url

    p = sub.add_parser("simulate", help="replay a workload trace (creates and deletes) "
                       "through the scheduler, under one or more configurations")
    p.add_argument("cloud", nargs="?", help="cloud description (YAML or JSON); or --url")
    p.add_argument("trace", help="the trace: CSV (docs/simulate.md) or the Azure packing "
                                 "trace 2020 (SQLite)")
    p.add_argument("--url", type=server_url, help="replay against this running Berth instead of a cloud file")
    p.add_argument("--token", default="admin", help="with --url: the X-Auth-Token to send")
    p.add_argument("--config-file", action="append", default=[],
                   help="nova.conf of the first configuration (repeatable, later files win)")
    p.add_argument("--compare", action="append", default=[], metavar="NOVA_CONF",
                   help="another configuration to replay the same trace under (repeatable: "
                        "one configuration each)")
    p.add_argument("--out", help="write result.json, the plots and report.html here")
    p.add_argument("--json", dest="json_path", metavar="FILE",
                   help="write the results as JSON ('-': standard output)")
    p.add_argument("--plots", metavar="DIR", help="write every plot as PNG and SVG here")
    p.add_argument("--html", metavar="FILE", help="write the HTML report here")
    p.add_argument("--samples", type=samples_count, default=200,
                   help="instants of the trace sampled for the time series (default 200, "
                        f"at most {MAX_SAMPLES:,})")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="replay only the first N rows (VMs of an Azure trace)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the scheduler (default 0)")
    p.add_argument("--now", type=instant, default=None, help="the instant, epoch seconds")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on standard error (default: when it is a terminal)")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help="configurations replayed at once, each in a process of its own "
                        "(default: the number of CPUs; 1: one after the other in this process)")
    p.add_argument("--azure-machine", type=azure_machine, default=None,
                   metavar="VCPUS,MEMORY_MB,DISK_GB",
                   help="the machine an Azure trace's fractions are of (default with a cloud "
                        "file: its most common compute node; needed with --url)")
    p.add_argument("--azure-machine-id", type=int, default=None,
                   help="the Azure machineId whose VM type sizes to use (default: the one with "
                        "the most VM types)")
    p.set_defaults(func=cmd_simulate)

    trace = sub.add_parser("trace", help="workload trace tools").add_subparsers(
        dest="action", required=True)
    g = trace.add_parser("generate", help="write a synthetic trace (Poisson arrivals, "
                         "lifetimes, a flavor mix), seeded")
    g.add_argument("--creates", type=positive_int, required=True,
                   help=f"number of creates (at most {MAX_CREATES:,})")
    g.add_argument("--rate", type=float, required=True, help="creates per second (mean)")
    g.add_argument("--lifetime", default="exp:3600",
                   help="exp:MEAN, lognormal:MEDIAN,SIGMA, uniform:LOW,HIGH or fixed:S "
                        "(seconds; default exp:3600)")
    g.add_argument("--flavor-mix", help="NAME[=WEIGHT],... (default: every flavor of --cloud, "
                                        "equally)")
    g.add_argument("--cloud", help="a cloud file whose flavors make the mix")
    g.add_argument("--group-fraction", type=float, default=0.0,
                   help="share of creates that join a server group (default 0)")
    g.add_argument("--groups", type=int, default=4, help="number of server groups (default 4)")
    g.add_argument("--group-policy", default="anti-affinity",
                   help="their policy (default anti-affinity)")
    g.add_argument("--image", help="image name every create uses")
    g.add_argument("--duration", type=float, default=None,
                   help="end the trace here (seconds); later arrivals are dropped")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument("-o", "--output", required=True, help="the CSV file to write")
    g.set_defaults(func=cmd_trace_generate)


def cmd_trace_generate(args: Any) -> int:
    """Write a generated trace."""
    from berth.simulate.generate import GroupSpec, Lifetime, generate, parse_mix
    from berth.simulate.trace import write_csv

    check_output("--output", args.output)
    lifetime = Lifetime.parse(args.lifetime)
    cloud = None
    if args.cloud:
        from berth.cli import _load_config
        from berth.cloudfile import load_cloud

        try:
            cloud = load_cloud(args.cloud, _load_config(None))
        except CloudFileError as exc:
            raise CloudFileError(f"--cloud {exc.message}", field="--cloud") from None
    if args.flavor_mix:
        mix = parse_mix(args.flavor_mix)
        known = list(cloud.known_flavors()) if cloud is not None else []
        unknown = sorted(set(mix) - set(known)) if cloud is not None else []
        if cloud is not None and unknown:
            raise InputError(f"--flavor-mix: flavor {unknown[0]!r} is not one of --cloud's "
                             f"or Berth's defaults (known: {', '.join(known)})",
                             field="--flavor-mix")
    elif cloud is not None:
        mix = {name: 1.0 for name in cloud.own_flavors()}
    else:
        raise InputError("give --flavor-mix or --cloud (whose flavors make the mix)",
                         field="--flavor-mix")
    if cloud is not None and args.image and args.image not in cloud.images:
        raise InputError(f"--image: {args.image!r} is not one of --cloud's images (known: "
                         f"{', '.join(sorted(cloud.images)) or 'none'})", field="--image")
    trace = generate(creates=args.creates, rate=args.rate, lifetime=lifetime,
                     mix=mix, seed=args.seed, image=args.image, duration=args.duration,
                     groups=GroupSpec(args.group_fraction, args.groups, args.group_policy))
    with writing("--output", args.output):
        write_csv(trace, args.output)
    deletes = len(trace.events) - trace.creates()
    creates = trace.creates()
    print(f"wrote {args.output}: {creates} create{'s' * (creates != 1)}, {deletes} "
          f"delete{'s' * (deletes != 1)} over {trace.duration:.0f} s")
    return 0


def cmd_simulate(args: Any) -> int:
    """Replay the trace under every configuration and write what was asked for."""
    import time

    from berth.cli import _load_config
    from berth.simulate.jobs import Job, ReplayOptions, cpus, replay_all

    if (args.cloud is None) == (args.url is None):
        raise InputError("give a cloud file or --url (one of them)", field="cloud")
    if args.url and args.config_file:
        raise InputError("--config-file: a running Berth schedules with its own configuration; "
                         "replay a cloud file to choose one", field="--config-file")
    if args.url and args.compare:
        raise InputError("--compare: a running Berth has one configuration (its own); compare "
                         "configurations on a cloud file", field="--compare")
    _check_outputs(args)  # before the replay: a path that cannot be written loses no work
    file_sets = [list(args.config_file)] + [[path] for path in args.compare]
    for files in file_sets:
        _load_config(files)  # every configuration checked before any replay starts
    labels = [args.url] if args.url else _labels(file_sets)
    now = time.time() if args.now is None else args.now
    # Counted once, before the cloud loads: it sizes each configuration's scratch store.
    events = 0 if args.url else events_at_most(args.trace, limit=args.limit)
    jobs = [Job(tuple(files), label) for files, label in zip(file_sets, labels)]
    results = replay_all(ReplayOptions.from_args(args), jobs, now, events,
                         workers=args.jobs or cpus(), progress=args.progress)
    _write(args, results)
    return 0


def _labels(file_sets: list[list[str]]) -> list[str]:
    labels = []
    for files in file_sets:
        base = "+".join(Path(f).stem for f in files) or "default"
        label, n = base, 2
        while label in labels:
            label, n = f"{base}-{n}", n + 1
        labels.append(label)
    return labels


def check_output(option: str, path: str, *, directory: bool = False) -> None:
    """That ``path`` can be written as ``option`` asks, before any work: a file (its
    directory exists and takes a new file, or the file exists and is writable) or, with
    ``directory``, a directory (existing, or made under the nearest existing one); an
    InputError naming the option otherwise. (Some failures only show when written, a
    full disk or ``/dev/full``: :func:`writing` reports those.)"""
    if not path:
        raise InputError(f"{option}: expected a path, got ''", field=option)
    p = Path(path)
    if directory:
        if p.exists() and not p.is_dir():
            raise InputError(f"{option} {path}: not a directory", field=option)
        parent = p
        while not parent.exists():  # made with its parents: where the first one goes
            parent = parent.parent
        if not parent.is_dir():
            raise InputError(f"{option} {path}: {parent} is not a directory", field=option)
        _check_writable(option, path, parent)
        return
    if p.is_dir():
        raise InputError(f"{option} {path}: is a directory, expected a file", field=option)
    parent = p.parent
    if not parent.exists():
        raise InputError(f"{option} {path}: no such directory {str(parent)!r}", field=option)
    if not parent.is_dir():
        raise InputError(f"{option} {path}: {parent} is not a directory", field=option)
    if p.exists():
        if not os.access(p, os.W_OK):
            raise InputError(f"{option} {path}: cannot write (permission denied)",
                             field=option)
    else:
        _check_writable(option, path, parent)


def _check_writable(option: str, path: str, directory: Path) -> None:
    """A new file can be made in ``directory`` (tried: access() says yes to root on
    read-only or virtual file systems)."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise InputError(f"{option} {path}: cannot write in {directory} "
                         f"({exc.strerror or exc})", field=option) from None


@contextmanager
def writing(option: str, path: str) -> Iterator[None]:
    """An OSError while writing ``option``'s ``path`` as one InputError naming both."""
    try:
        yield
    except OSError as exc:
        raise InputError(f"{option} {path}: cannot write: {exc.strerror or exc}",
                         field=option) from None


def _outputs(args: Any) -> tuple[tuple[str, str] | None, tuple[str, str] | None,
                                 tuple[str, str] | None]:
    """The JSON file, the plots' directory and the HTML file to write, each as (the
    option that named it, path), or None; ``--out`` fills in those not given."""
    json_path = ("--json", args.json_path) if args.json_path is not None else None
    plots = ("--plots", args.plots) if args.plots is not None else None
    html_path = ("--html", args.html) if args.html is not None else None
    if args.out is not None:
        out = Path(args.out)
        json_path = json_path or ("--out", str(out / "result.json"))
        plots = plots or ("--out", str(out))
        html_path = html_path or ("--out", str(out / "report.html"))
    return json_path, plots, html_path


def _check_outputs(args: Any) -> None:
    """Every path the results go to can be written (see :func:`check_output`)."""
    if args.out is not None:
        check_output("--out", args.out, directory=True)
    json_path, plots, html_path = _outputs(args)
    for spec, directory in ((json_path, False), (plots, True), (html_path, False)):
        if spec is None or spec == ("--json", "-"):
            continue
        option, path = spec
        if option == "--out" and not Path(args.out).is_dir():
            continue  # inside --out, made before the results are written
        check_output(option, path, directory=directory)


def _write(args: Any, results: list[Any]) -> None:
    from berth.simulate.report import html_report, text_report, write_json, write_plots

    if args.out is not None:
        with writing("--out", args.out):
            Path(args.out).mkdir(parents=True, exist_ok=True)
    json_spec, plots_spec, html_spec = _outputs(args)
    json_path = json_spec[1] if json_spec else None
    written = []
    if json_spec and json_path == "-":
        import json

        print(json.dumps({"configurations": [r.to_dict() for r in results]}, indent=2))
    elif json_spec:
        with writing(*json_spec):
            write_json(results, json_spec[1])
        written.append(json_spec[1])
    if plots_spec:
        with writing(*plots_spec):
            written += write_plots(results, plots_spec[1])
    if html_spec:
        with writing(*html_spec):
            Path(html_spec[1]).write_text(html_report(results), encoding="utf-8")
        written.append(html_spec[1])
    if json_path != "-":
        print(text_report(results))
        if written:
            print(f"\nwrote {', '.join(written)}")
