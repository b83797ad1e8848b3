"""``berth simulate``: a trace replayed through the scheduler, offline and against a
running ``berth serve``, with its JSON, plots and HTML report."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest
import sqlalchemy as sa

from berth.cli import main
from berth.config import SchedulerConfig
from berth.errors import InputError
from berth.placement.amounts import over_api
from berth.service import offline
from berth.service.offline import offline_cloud, scratch
from berth.simulate import run
from berth.simulate.run import Replay
from berth.simulate.targets import LocalTarget, RemoteTarget
from berth.simulate.trace import read_csv
from service.serving import berth_serve

CLOUD = """
host_defaults: {cpu_allocation_ratio: 1.0, ram_allocation_ratio: 1.0}
hosts:
  - {host: "n{index:02d}", count: 6, vcpus: 16, memory_mb: 33280, local_gb: 400}
  - {host: "old{index:02d}", count: 2, vcpus: 8, memory_mb: 16896, local_gb: 200}
  - {host: "off01", vcpus: 16, memory_mb: 32768, local_gb: 400,
     service: {disabled: true, disabled_reason: maintenance}}
flavors:
  - {name: small, vcpus: 2, memory_mb: 4096, root_gb: 20}
  - {name: large, vcpus: 8, memory_mb: 16384, root_gb: 80}
images:
  - {name: cirros}
"""

TRACE = """time,event,id,flavor,image,num,group,policy,hints,project
0,create,web-1,small,cirros,1,web,anti-affinity,,
1,create,web-2,small,,1,web,,,
2,create,web-3,small,,1,web,,,
3,create,db,large,,2,,,,
4,create,near-db,small,,1,,,"{""same_host"": [""db""]}",
5,delete,web-2,,,,,,,
6,create,bulk-1,large,,6,,,,
7,create,bulk-2,large,,6,,,,
8,create,huge,large,,1,,,"{""different_host"": [""web-1"", ""web-3""]}",
9,delete,bulk-2,,,,,,,
10,delete,db,,,,,,,
11,create,tail,small,,3,,,,
"""

STACK = "[filter_scheduler]\nram_weight_multiplier = -1.0\ncpu_weight_multiplier = -1.0\n" \
        "disk_weight_multiplier = -1.0\n"


def replay_offline(cloud: str, trace: str, config: SchedulerConfig):  # type: ignore[no-untyped-def]
    with offline_cloud(cloud, config, now=1.7e9) as offline:
        target = LocalTarget(offline, seed=0)
        replay = Replay(target, read_csv(trace), config=config, label="x", samples=20)
        result = replay.run()
        stack = offline.stack
        # The ledger kept from the boots' answers is what placement holds.
        for row, root in enumerate(replay.ledger.roots):
            used = Counter(stack.client.provider_usages(root))
            assert {rc: int(replay.ledger.used[row, col]) for rc, col in
                    replay.ledger.col.items() if used.get(rc) or replay.ledger.used[row, col]
                    } == {rc: n for rc, n in used.items() if n}
        # The counters kept by every allocation agree with the usage itself.
        ledger = replay.ledger
        assert ledger.in_use == int(np.count_nonzero(ledger.used.sum(axis=1)))
        assert ledger.totals == [int(v) for v in ledger.used.sum(axis=0)]
        hosts = {i.uuid: i.host for i in stack.instances.all()}
        groups = {g.name: g for g in stack.groups.all()}
        return result, hosts, groups, replay


def test_a_replay_counts_refusals_by_cause_and_keeps_policies(files: tuple[str, str, str]) -> None:
    cloud, trace, _ = files
    result, hosts, groups, replay = replay_offline(cloud, trace, SchedulerConfig.default())
    # 6 roomy hosts of 16 vCPUs and 2 of 8: the second bulk of six large instances
    # cannot fit whole (a request is placed whole or not at all).
    assert result.requests == 9
    assert result.instances_requested == 1 + 1 + 1 + 2 + 1 + 6 + 6 + 1 + 3
    assert result.causes and sum(result.causes.values()) == \
        result.instances_requested - result.instances_accepted
    assert result.first_refusal is not None and result.first_refusal["id"] == "bulk-2"
    # Placement offered hosts for the request, whose claims ran out of room one by one.
    assert result.causes == {"claims": 6} and result.first_refusal["cause"] == "claims"
    assert result.deletes == 3 and result.deletes_of_refused == 1
    # Anti-affinity: the live members of "web" are on different hosts.
    web = groups["web"]
    assert web.policy == "anti-affinity"
    live_web = [hosts[m] for m in web.members if m in hosts]
    assert len(live_web) == len(set(live_web)) == 2
    # The disabled host takes nothing; what is live at the end is what the trace left.
    assert "off01" not in set(hosts.values())
    assert len(hosts) == result.samples[-1].live
    # 20 instants as asked, from the first event to the last, evenly spaced.
    times = [s.time for s in result.samples]
    assert len(times) == 20 and times[0] == 0.0 and times[-1] == 11.0
    assert times[:3] == [0.0, round(11 / 19, 3), round(22 / 19, 3)]


def test_a_replay_is_deterministic_and_stacking_uses_fewer_hosts(
        files: tuple[str, str, str]) -> None:
    cloud, trace, stack = files
    one = replay_offline(cloud, trace, SchedulerConfig.default())[0]
    two = replay_offline(cloud, trace, SchedulerConfig.default())[0]
    assert [s.hosts_in_use for s in one.samples] == [s.hosts_in_use for s in two.samples]
    packed = replay_offline(cloud, trace, SchedulerConfig.from_files([stack]))[0]
    assert sum(s.hosts_in_use for s in packed.samples) < sum(s.hosts_in_use for s in one.samples)


def test_simulate_writes_json_plots_and_a_self_contained_report(
        files: tuple[str, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cloud, trace, stack = files
    out = tmp_path / "out"
    assert main(["simulate", cloud, trace, "--compare", stack, "--out", str(out),
                 "--no-progress", "--samples", "30"]) == 0
    text = capsys.readouterr().out
    assert "acceptance rate" in text and "default" in text and "stack" in text
    data = json.loads((out / "result.json").read_text())
    labels = [c["label"] for c in data["configurations"]]
    assert labels == ["default", "stack"]
    for c in data["configurations"]:
        assert c["hosts"] == 9 and c["events"] == 12
        assert set(c["samples"][0]["utilization"]) == {"DISK_GB", "MEMORY_MB", "VCPU"}
        assert c["request_ms"]["p50"] > 0
    for name in ("utilization", "hosts", "acceptance", "refusals", "latency", "fragmentation"):
        assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert "<svg" in (out / f"{name}.svg").read_text()
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 6 and "<script" not in page and 'src="http' not in page
    assert "stack" in page and "acceptance rate" in page


def test_simulate_json_to_stdout(files: tuple[str, str, str],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    cloud, trace, _ = files
    assert main(["simulate", cloud, trace, "--json", "-", "--no-progress"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["configurations"][0]["refusals_by_cause"]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace("large,,1,,,\"{", "xlarge,,1,,,\"{"),
     "flavor 'xlarge' is neither the cloud's nor the trace's"),
    (lambda t: t.replace("small,cirros", "small,fedora"), "image 'fedora' is not the cloud's"),
    (lambda t: t.replace("web,anti-affinity", "web,"), "at t=0 (line 2): group 'web' is not the cloud's"),
])
def test_a_trace_the_cloud_cannot_run_is_one_line(files: tuple[str, str, str], edit,  # type: ignore[no-untyped-def]
                                                  message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cloud, trace, _ = files
    Path(trace).write_text(edit(TRACE))
    assert main(["simulate", cloud, trace, "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_simulate_usage_errors(files: tuple[str, str, str],
                               capsys: pytest.CaptureFixture[str]) -> None:
    cloud, trace, stack = files
    assert main(["simulate", trace, "--no-progress"]) == 3
    assert "give a cloud file or --url" in capsys.readouterr().err
    assert main(["simulate", "--url", "http://127.0.0.1:9", trace, "--compare", stack]) == 3
    assert "--compare: a running Berth has one configuration" in capsys.readouterr().err
    # A configuration file would be checked and then ignored: refused instead.
    assert main(["simulate", "--url", "http://127.0.0.1:9", trace, "--config-file",
                 stack]) == 3
    assert capsys.readouterr().err == (
        "error: --config-file: a running Berth schedules with its own configuration; "
        "replay a cloud file to choose one\n")
    # A cloud file before --url and the trace after: argparse took the cloud file for
    # the trace; the message says what to leave out.
    with pytest.raises(SystemExit) as caught:
        main(["simulate", cloud, "--url", "http://127.0.0.1:9", trace])
    assert caught.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "berth: error: simulate: --url replays against the running Berth's own cloud: give "
        f"the trace alone, without the cloud file {cloud!r}")
    with pytest.raises(SystemExit):
        main(["simulate", cloud, trace, "--bogus"])
    assert capsys.readouterr().err.splitlines()[-1] == \
        "berth: error: unrecognized arguments: --bogus"


def test_the_same_trace_replays_against_a_running_berth_with_the_same_outcome(
        files: tuple[str, str, str], tmp_path: Path) -> None:
    """Offline and online are one path: the same cloud, trace and seed give the same
    acceptance, refusals and hosts in use; the deletes free their allocations there."""
    cloud, trace, _ = files
    offline = replay_offline(cloud, trace, SchedulerConfig.default())[0]
    with berth_serve(tmp_path, "--cloud", cloud, "--seed", "0") as url:
        target = RemoteTarget(url)
        try:
            online = Replay(target, read_csv(trace), config=SchedulerConfig.default(),
                            label="online", samples=20).run()
            servers = httpx.get(url + "/servers", headers={"X-Auth-Token": "admin"}).json()
            groups = httpx.get(url + "/server-groups",
                               headers={"X-Auth-Token": "admin"}).json()["server_groups"]
        finally:
            target.close()
    assert online.instances_accepted == offline.instances_accepted
    assert online.causes == offline.causes
    assert [s.hosts_in_use for s in online.samples] == [s.hosts_in_use for s in offline.samples]
    assert len(servers["servers"]) == online.samples[-1].live
    assert [g["policy"] for g in groups if g["name"] == "web"] == ["anti-affinity"]


def test_the_offline_scratch_store_commits_without_syncing(tmp_path: Path) -> None:
    """The scratch store an offline run registers the cloud into is thrown away, so its
    commits skip the disk sync; a store opened as ``berth serve`` opens one keeps it."""
    from berth.service.stack import open_stack

    def synchronous(engine) -> int:  # type: ignore[no-untyped-def]
        with engine.connect() as conn:
            return int(conn.exec_driver_sql("PRAGMA synchronous").scalar())

    example = str(Path(__file__).resolve().parents[2] / "examples" / "cloud.yaml")
    with offline_cloud(example, SchedulerConfig.default(), now=1.7e9) as offline:
        assert synchronous(offline.stack.engine) == 0  # OFF
    stack = open_stack(f"sqlite:///{tmp_path}/served.sqlite")
    try:
        assert synchronous(stack.engine) == 1  # NORMAL
    finally:
        stack.close()


NESTED = """
host_defaults: {cpu_allocation_ratio: 4.0, ram_allocation_ratio: 1.5}
aggregates:
  - {name: az1, hosts: [n01, n02], metadata: {availability_zone: az1}}
hosts:
  - {host: "n{index:02d}", count: 2, vcpus: 16, memory_mb: 32768, local_gb: 0,
     providers: [{name: NUMA0}, {name: pf0, parent: NUMA0,
                  resources: {SRIOV_NET_VF: {total: 16, max_unit: 16}}}]}
  - {host: "solo", vcpus: 8, memory_mb: 16384, local_gb: 100}
sharing_providers:
  - {name: nfs1, resources: {DISK_GB: {total: 2000}}, aggregates: [az1]}
flavors:
  - {name: small, vcpus: 2, memory_mb: 4096, root_gb: 20}
"""


def test_the_ledger_reads_in_process_what_the_placement_api_answers(tmp_path: Path) -> None:
    """A replay in process reads its ledger from the store's provider graph in one go;
    over HTTP it asks the Placement API for each provider. Both read the same amounts:
    nested providers on their node, a sharing provider's disk, the reserved memory
    (nova.conf's 512 MB by default) and allocation ratios, and the usage of what was
    booted before."""
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(NESTED)
    with offline_cloud(str(cloud), SchedulerConfig.default(), now=1.7e9) as offline:
        target = LocalTarget(offline, seed=0)
        assert target.boot({"flavor": "small", "num": 3}).refused == 0
        local = target.provider_amounts()
        through_api = over_api(offline.stack.client)
    assert sorted(local, key=lambda p: p.uuid) == sorted(through_api, key=lambda p: p.uuid)
    assert len(local) == 3 * 2 + 1 + 1  # two trees of three, solo, nfs1
    assert sum(p.used.get("VCPU", 0) for p in local) == 6
    assert {p.capacity.get("MEMORY_MB") for p in local} >= {int((32768 - 512) * 1.5)}


def test_a_scratch_store_is_in_memory_unless_it_could_outgrow_it(tmp_path: Path) -> None:
    with scratch(1000, 100_000) as url:
        assert "vfs=memdb" in url
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x)")
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        engine.dispose()  # every connection of the engine closed: the data stays
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT x FROM t").scalar() == 1
        engine.dispose()
    engine = sa.create_engine(url)  # gone on exit
    with engine.connect() as conn, pytest.raises(sa.exc.OperationalError, match="no such table"):
        conn.exec_driver_sql("SELECT x FROM t")
    engine.dispose()
    # SQLite's memdb stops at 1 GiB: a store estimated past half of it is a file,
    # removed on exit.
    with scratch(1000, 10_000_000) as url:
        path = Path(url.removeprefix("sqlite:///"))
        assert path.parent.is_dir() and "memdb" not in url
    assert not path.parent.exists()
    with scratch(100_000) as url:
        assert "memdb" not in url


def test_a_replay_answers_the_same_from_memory_and_from_a_file(
        files: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    cloud, trace, _ = files
    config = SchedulerConfig.default()
    in_memory = replay_offline(cloud, trace, config)
    monkeypatch.setattr(offline, "MEMORY_BUDGET", 0)
    on_disk = replay_offline(cloud, trace, config)
    assert in_memory[1] == on_disk[1]  # every instance on the same host
    assert in_memory[0].causes == on_disk[0].causes
    assert in_memory[0].instances_accepted == on_disk[0].instances_accepted


@pytest.mark.parametrize(("args", "message"), [
    (["--out", "FILE"], "--out FILE: not a directory"),
    (["--out", "/dev/null"], "--out /dev/null: not a directory"),
    (["--out", "FILE/sub"], "--out FILE/sub: DIR/file is not a directory"),
    (["--out", "DIR/busy"], "--out DIR/busy/result.json: is a directory, expected a file"),
    (["--out", ""], "--out: expected a path, got ''"),
    (["--json", "DIR"], "--json DIR: is a directory, expected a file"),
    (["--json", "DIR/nodir/r.json"], "--json DIR/nodir/r.json: no such directory 'DIR/nodir'"),
    (["--json", ""], "--json: expected a path, got ''"),
    (["--html", "DIR"], "--html DIR: is a directory, expected a file"),
    (["--html", "FILE/r.html"], "--html FILE/r.html: DIR/file is not a directory"),
    (["--plots", "FILE"], "--plots FILE: not a directory"),
    (["--plots", "/proc/x"], "--plots /proc/x: cannot write in /proc"),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_replay(
        files: tuple[str, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    if "/proc" in args[-1] and not Path("/proc/self").is_dir():
        pytest.skip("no /proc")
    cloud, trace, _ = files
    (tmp_path / "file").write_text("")
    (tmp_path / "busy" / "result.json").mkdir(parents=True)

    def fill(text: str) -> str:
        return text.replace("FILE", str(tmp_path / "file")).replace("DIR", str(tmp_path))

    def no_replay(*_: object, **__: object) -> None:
        raise AssertionError("the replay ran")

    monkeypatch.setattr(run.Replay, "__init__", no_replay)
    assert main(["simulate", cloud, trace, "--no-progress", *map(fill, args)]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"error: {fill(message)}") and err.count("\n") == 1


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("option", ["--json", "--html"])
def test_an_output_failing_as_it_is_written_is_one_line(
        files: tuple[str, str, str], option: str, capsys: pytest.CaptureFixture[str]) -> None:
    cloud, trace, _ = files
    assert main(["simulate", cloud, trace, "--no-progress", option, "/dev/full"]) == 3
    assert capsys.readouterr().err == (
        f"error: {option} /dev/full: cannot write: No space left on device\n")


def test_outputs_in_a_new_directory_and_to_standard_output_still_work(
        files: tuple[str, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cloud, trace, _ = files
    out = tmp_path / "new" / "deeper"
    assert main(["simulate", cloud, trace, "--no-progress", "--out", str(out),
                 "--json", "-", "--html", str(tmp_path / "r.html")]) == 0
    assert json.loads(capsys.readouterr().out)["configurations"]
    assert (out / "hosts.svg").exists() and not (out / "result.json").exists()
    assert (tmp_path / "r.html").read_text().count("<svg") == 6


@pytest.mark.parametrize(("args", "message"), [
    (["--samples", "100000000"], "argument --samples: expected an integer from 1 to 100,000, "
                                 "got '100000000'"),
    (["--samples", "0"], "argument --samples: expected an integer from 1 to 100,000, got '0'"),
    (["--now", "nan"], "argument --now: expected epoch seconds, got 'nan'"),
    (["--now", "inf"], "argument --now: expected epoch seconds, got 'inf'"),
    (["--now", "-inf"], "argument --now: expected epoch seconds, got '-inf'"),
    (["--now", "soon"], "argument --now: expected epoch seconds, got 'soon'"),
])
def test_simulate_option_values_are_checked(files: tuple[str, str, str], args: list[str],
                                            message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cloud, trace, _ = files
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", cloud, trace, "--no-progress", f"{args[0]}={args[1]}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"berth simulate: error: {message}"


def test_samples_of_a_trace_far_from_zero_end(files: tuple[str, str, str],
                                              tmp_path: Path) -> None:
    # At t=1e15 a step of 0.01 s does not move a float: the instants are counted, not
    # summed, so the samples end.
    cloud, _, _ = files
    trace = tmp_path / "late.csv"
    trace.write_text("time,event,id,flavor\n1e15,create,a,small\n1000000000000001,delete,a,\n")
    config = SchedulerConfig.default()
    with offline_cloud(cloud, config, now=1.7e9) as cloud_offline:
        result = Replay(LocalTarget(cloud_offline, seed=0), read_csv(str(trace)), config=config,
                        label="x", samples=100).run()
    assert len(result.samples) == 100
    assert result.samples[0].time == 1e15 and result.samples[-1].time == 1e15 + 1


def test_peaks_and_the_mean_are_of_every_instant_whatever_the_samples(
        files: tuple[str, str, str]) -> None:
    """The peaks are the highest hosts in use and utilization after any event, and the
    mean weighs each count by how long it lasted: none of them moves with
    ``--samples`` (which only sets the time series' instants)."""
    cloud, trace, _ = files
    config = SchedulerConfig.default()
    results, seen = {}, []
    for samples in (1, 2, 7, 500):
        with offline_cloud(cloud, config, now=1.7e9) as cloud_offline:
            replay = Replay(LocalTarget(cloud_offline, seed=0), read_csv(trace), config=config,
                            label="x", samples=samples)
            if samples == 500:
                replay.on_event = lambda _n, ledger=replay.ledger: seen.append(
                    (ledger.hosts_in_use(), ledger.utilization()))
            results[samples] = replay.run()
    assert [len(r.samples) for r in results.values()] == [1, 2, 7, 500]
    peaks = [r.peak() for r in results.values()]
    assert all(p == peaks[-1] for p in peaks)
    assert peaks[-1]["hosts_in_use"] == max(n for n, _ in seen)
    assert peaks[-1]["utilization"] == {
        rc: round(max(u[rc] for _, u in seen), 6) for rc in seen[0][1]}
    # One sample at each end misses the peak between them.
    assert max(s.utilization["MEMORY_MB"] for s in results[2].samples) < \
        peaks[-1]["utilization"]["MEMORY_MB"]
    # The events come one a second, so the time-weighted mean is the mean over the
    # counts each event left (the last event's count lasts no time).
    assert peaks[-1]["mean_hosts_in_use"] == round(sum(n for n, _ in seen[:-1]) / 11, 2)


def test_a_create_gets_the_zone_of_its_row_and_an_unknown_zone_names_the_row(
        tmp_path: Path) -> None:
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(NESTED)
    trace = tmp_path / "zones.csv"
    trace.write_text("time,event,id,flavor,num,availability_zone\n"
                     "0,create,in-az1,small,3,az1\n1,create,anywhere,small,2,\n")
    config = SchedulerConfig.default()
    with offline_cloud(str(cloud), config, now=1.7e9) as cloud_offline:
        replay = Replay(LocalTarget(cloud_offline, seed=0), read_csv(str(trace)), config=config,
                        label="x", samples=2)
        assert replay.run().instances_accepted == 5
        hosts = {i.uuid: i.host for i in cloud_offline.stack.instances.all()}
        zoned = [hosts[uuid] for uuid, _ in replay.live["in-az1"]]
        assert len(zoned) == 3 and set(zoned) <= {"n01", "n02"}
    trace.write_text("time,event,id,flavor,availability_zone\n0,create,lost,small,nowhere\n")
    with offline_cloud(str(cloud), config, now=1.7e9) as cloud_offline, \
            pytest.raises(InputError) as info:
        Replay(LocalTarget(cloud_offline, seed=0), read_csv(str(trace)), config=config,
               label="x", samples=2).run()
    assert str(info.value).startswith(
        f"trace {trace}: 'lost' at t=0 (line 2): availability_zone: the requested availability zone "
        "'nowhere' is not available")


def test_plots_without_refusals_say_so_and_times_read_as_numbers() -> None:
    from berth.simulate.report import figure
    from berth.simulate.run import RunResult

    quiet = RunResult("a", "t", 1, request_seconds=[0.002, 0.003, 0.004])
    fig = figure("refusals", [quiet, RunResult("b", "t", 1)])
    ax = fig.axes[0]
    assert not ax.patches and ax.get_legend() is None
    assert [t.get_text() for t in ax.texts] == ["no instance was refused"]
    fig = figure("latency", [quiet])
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels(minor=True)
              + fig.axes[0].get_xticklabels()]
    assert "3" in labels and not any("times" in x or "^" in x for x in labels)
