"""``berth serve`` and ``berth boot``: argument checks, what a cloud file seeds, and the
server process's start-up, restarts and simulated build failures."""

from __future__ import annotations

import json
import os
import random
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from berth.cli import build_parser, main
from berth.cloudfile import load_cloud
from berth.errors import CloudFileError
from berth.model.request import RequestSpec
from berth.pipeline import Scheduler
from berth.service.records import SnapshotFeed
from berth.service.seeding import seed_from_cloud
from berth.service.stack import Stack

from .builders import reopen
from .serving import free_port

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}


# ----------------------------------------------------------------- arguments
@pytest.mark.parametrize("argv, message", [
    (["boot", "--flavor", "f", "--num", "0"], "argument --num: expected a positive integer, got '0'"),
    (["boot", "--flavor", "f", "--num", "1001"], "argument --num: at most 1000 instances per "
                                                 "request, got 1001"),
    (["boot", "--flavor", "f", "--num", "many"], "argument --num: expected a positive integer"),
    (["serve", "--port", "70000"], "argument --port: expected a port number 0-65535, got 70000"),
    (["serve", "--port", "http"], "argument --port: expected a port number, got 'http'"),
    (["serve", "--threads", "0"], "argument --threads: expected a positive integer, got '0'"),
    (["serve", "--fail-first", "h1"], "argument --fail-first: expected HOST=N, got 'h1'"),
    (["serve", "--fail-first", "h1=-2"], "argument --fail-first: expected HOST=N with N a "
                                         "positive integer"),
], ids=["no instances", "more instances than the API takes", "a word for --num",
        "a port above 65535", "a port that is not a number", "no server threads",
        "--fail-first without a count", "--fail-first with a negative count"])
def test_bad_arguments_exit_2_naming_the_argument(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_boot_group_sends_the_group_hint(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    sent: list[object] = []

    def request(method: str, url: str, json: object = None, timeout: float = 0,
                headers: object = None) -> httpx.Response:
        assert method == "POST"
        sent.append(json)
        return httpx.Response(200, json={"instances": []})

    monkeypatch.setattr(httpx, "request", request)
    assert main(["boot", "--flavor", "m1.tiny", "--group", "web", "--num", "2"]) == 0
    assert sent[0]["hints"] == {"group": ["web"]}  # type: ignore[index]
    assert main(["boot", "--flavor", "m1.tiny", "--group", "web", "--hint", "group=db"]) == 3
    assert "--group 'web' and --hint group='db' disagree" in capsys.readouterr().err


def test_boot_prints_what_was_built_and_what_was_not(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    answer = {
        "error": {"code": "berth.scheduling.max_retries_exceeded",
                  "message": "1 of 2 instances not built (1 built): Exceeded ..."},
        "instances": [{"instance_uuid": "u1", "host": "h1", "nodename": "h1", "tried": ["h1"],
                       "alternates": []}],
        "failed": [{"instance_uuid": "u2", "tried": ["h2"],
                    "error": {"code": "berth.scheduling.max_retries_exceeded",
                              "message": "Exceeded maximum number of retries."}}]}
    monkeypatch.setattr(httpx, "request", lambda *a, **k: httpx.Response(409, json=answer))
    assert main(["boot", "--flavor", "m1.tiny", "--num", "2"]) == 6
    out, err = capsys.readouterr()
    assert out.splitlines()[1].split()[:3] == ["1", "u1", "h1"]
    assert "instance u2 not built (tried h2): Exceeded maximum number of retries." in err


# ----------------------------------------------------------------- seeding
CLOUD = """
flavors:
  - {name: web, vcpus: 2, memory_mb: 2048, root_gb: 10}
hosts:
  - {host: b1, vcpus: 8, memory_mb: 8704, local_gb: 100, io_workload: 3,
     stats: {rack: r7, num_instances: 4},
     instances: [{uuid: 0b8f9c3e-0000-4000-8000-000000000001, flavor: web}]}
  - {host: f1, vcpus: 8, memory_mb: 8704, local_gb: 100, failed_builds: 2}
server_groups:
  - {name: web, policy: anti-affinity, members: [0b8f9c3e-0000-4000-8000-000000000001]}
"""


def _cloud(tmp_path: Path, text: str = CLOUD) -> str:
    """``text`` in a file of its own (one per distinct text)."""
    path = tmp_path / f"cloud-{abs(hash(text)):x}.yaml"
    path.write_text(text)
    return str(path)


def test_a_seeded_host_reports_what_the_cloud_file_says(stack: Stack, tmp_path: Path) -> None:
    path = _cloud(tmp_path)
    seed_from_cloud(stack, path)
    served = SnapshotFeed(stack.records).refresh()
    offline = load_cloud(path, stack.config, now=time.time()).snapshot
    for host in ("b1", "f1"):
        a, b = offline.row_of(host), served.row_of(host)
        for column in ("num_io_ops", "failed_builds", "num_instances", "vcpus_used",
                       "free_ram_mb", "free_disk_mb"):
            assert offline.num(column)[a] == served.num(column)[b], (host, column)
    assert served.interned_value("stats", served.row_of("b1"))["rack"] == "r7"
    (group,) = stack.groups.find("web")
    assert group.policy == "anti-affinity"
    assert stack.groups.resolve("web").hosts == ["b1"]


SAME_DECISION_CLOUD = """
flavors:
  - {name: web, vcpus: 2, memory_mb: 2048, root_gb: 10}
hosts:
  - {host: busy, vcpus: 8, memory_mb: 16896, local_gb: 100, io_workload: 9}
  - {host: flaky, vcpus: 8, memory_mb: 12800, local_gb: 100, failed_builds: 2}
  - {host: calm, vcpus: 8, memory_mb: 8704, local_gb: 100}
"""


def test_serve_and_schedule_choose_the_same_host_on_the_same_file(
        stack: Stack, tmp_path: Path) -> None:
    # IoOpsFilter (at most 8) rejects busy; BuildFailureWeigher outweighs flaky's RAM.
    path = _cloud(tmp_path, SAME_DECISION_CLOUD)
    config = stack.config.replace("filter_scheduler", available_filters=["berth.filters.all_filters"],
                                  enabled_filters=["ComputeFilter", "IoOpsFilter"],
                                  weight_classes=["RAMWeigher", "BuildFailureWeigher"])
    served = reopen(stack, config)
    try:
        seed_from_cloud(served, path)
        service = served.scheduler(seed=1)
        offline = load_cloud(path, config, now=time.time())
        spec = RequestSpec(flavor=offline.flavor("web"))
        online = service.select_destinations(spec, service.new_instance_uuids(1))
        dry = Scheduler(config).select_destinations(spec, offline.snapshot, now=time.time(),
                                                    rng=random.Random(1))
        assert online.selections[0][0].service_host == dry.selections[0][0].service_host == "calm"
    finally:
        served.close()


def test_a_cloud_file_host_down_for_less_than_the_effective_down_time_is_up(
        template_db: Path, tmp_path: Path) -> None:
    from .conftest import TEST_CONFIG, fresh_stack

    # service_down_time 10 <= report_interval 10: the effective down time is 25 s.
    config = TEST_CONFIG.replace("DEFAULT", service_down_time=10, report_interval=10)
    st = fresh_stack(template_db, tmp_path, config)
    try:
        seen = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 15))
        seed_from_cloud(st, _cloud(tmp_path, "hosts:\n  - {host: h1, vcpus: 4, memory_mb: 4096,"
                                             f" local_gb: 40, service: {{last_seen_up: '{seen}'}}}}\n"))
        assert not st.agents["h1"].silent
    finally:
        st.close()


def test_a_cloud_file_that_conflicts_with_stored_allocations_changes_nothing(
        stack: Stack, tmp_path: Path) -> None:
    seed_from_cloud(stack, _cloud(tmp_path))
    b1 = stack.agents["b1"].uuid
    before = stack.client.get_inventories(b1)
    shrunk = _cloud(tmp_path, CLOUD.replace("local_gb: 100, io_workload", "local_gb: 0, io_workload"))
    with pytest.raises(CloudFileError, match=r"host b1: local_gb would leave it no DISK_GB "
                                             r"inventory, but its allocations in the database "
                                             r"use 10 DISK_GB"):
        seed_from_cloud(stack, shrunk)
    assert stack.client.get_inventories(b1) == before
    assert stack.client.provider_usages(b1)["DISK_GB"] == 10


# ----------------------------------------------------------------- the server process


def _serve(db: Path, *args: str, port: int | None = None) -> tuple[subprocess.Popen[str], str]:
    port = port or free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "berth.cli", "serve", "--auth-strategy", "noauth2", "--db", f"sqlite:///{db}", "--port",
         str(port), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, f"http://127.0.0.1:{port}"


def _wait_up(proc: subprocess.Popen[str], url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
    raise AssertionError("berth serve did not come up")


@pytest.fixture
def stopper() -> Iterator[list[subprocess.Popen[str]]]:
    """Servers started by a test, stopped after it."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    return out


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc, _ = _serve(tmp_path / "b.sqlite", port=port)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert out.strip().splitlines()[-1] == (f"berth serve: cannot listen on --host '127.0.0.1' "
                                            f"--port {port}: Address already in use")
    assert "Traceback" not in out


def test_serve_restarts_with_its_instances_and_refuses_a_conflicting_cloud_file(
        tmp_path: Path, stopper: list[subprocess.Popen[str]]) -> None:
    db, cloud = tmp_path / "b.sqlite", _cloud(tmp_path)
    proc, url = _serve(db, "--cloud", cloud)
    stopper.append(proc)
    _wait_up(proc, url)
    assert httpx.post(url + "/boot", json={"flavor": "web", "num": 2}, headers=ADMIN).status_code == 200
    before = {h["host"]: h["num_instances"] for h in httpx.get(url + "/hosts", headers=ADMIN).json()["hosts"]}
    log = _stop(proc)
    assert "INFO berth.service [-] registered 2 compute nodes" in log

    shrunk = _cloud(tmp_path, CLOUD.replace("local_gb: 100", "local_gb: 0"))
    bad = subprocess.run([sys.executable, "-m", "berth.cli", "serve", "--auth-strategy", "noauth2", "--db", f"sqlite:///{db}",
                          "--port", str(free_port()), "--cloud", shrunk],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 3 and "Traceback" not in bad.stderr
    assert "local_gb would leave it no DISK_GB inventory" in bad.stderr

    for args in (("--cloud", cloud), ()):  # with the file again, then from the stored hosts
        proc, url = _serve(db, *args)
        stopper.append(proc)
        _wait_up(proc, url)
        after = {h["host"]: h["num_instances"] for h in httpx.get(url + "/hosts", headers=ADMIN).json()["hosts"]}
        assert after == before
        _stop(proc)


def test_fail_host_makes_the_conductor_reschedule_onto_an_alternate(
        tmp_path: Path, stopper: list[subprocess.Popen[str]]) -> None:
    # RAMWeigher ranks big, mid, small.
    cloud = _cloud(tmp_path, "hosts:\n" + "".join(
        f"  - {{host: {h}, vcpus: 8, memory_mb: {ram}, local_gb: 100}}\n"
        for h, ram in (("big", 16896), ("mid", 12800), ("small", 8704))))
    proc, url = _serve(tmp_path / "b.sqlite", "--cloud", cloud, "--fail-host", "big")
    stopper.append(proc)
    _wait_up(proc, url)
    (instance,) = httpx.post(url + "/boot", json={"flavor": "m1.tiny"}, headers=ADMIN).json()["instances"]
    assert instance["tried"] == ["big", "mid"] and instance["host"] == "mid"
    _stop(proc)

    proc, url = _serve(tmp_path / "c.sqlite", "--cloud", cloud, "--fail-first", "big=1",
                       "--fail-first", "mid=1", "--fail-first", "small=1")
    stopper.append(proc)
    _wait_up(proc, url)
    resp = httpx.post(url + "/boot", json={"flavor": "m1.tiny"}, headers=ADMIN)
    assert resp.status_code == 409 and resp.json()["instances"] == []
    assert resp.json()["failed"][0]["tried"] == ["big", "mid", "small"]
    (instance,) = httpx.post(url + "/boot", json={"flavor": "m1.tiny"}, headers=ADMIN).json()["instances"]
    assert instance["tried"] == ["big"]  # each host failed its first build only


def test_with_retry_filter_serve_reschedules_through_the_scheduler_and_boot_shows_it(
        tmp_path: Path, stopper: list[subprocess.Popen[str]]) -> None:
    # The pre-alternates flow of seeds 000-002: RAMWeigher ranks big, mid, small; big and
    # mid fail every build, small its first; each failure goes back to the scheduler with
    # the hosts tried so far, and RetryFilter keeps the request off them.
    cloud = _cloud(tmp_path, "hosts:\n" + "".join(
        f"  - {{host: {h}, vcpus: 8, memory_mb: {ram}, local_gb: 100}}\n"
        for h, ram in (("big", 16896), ("mid", 12800), ("small", 8704))))
    conf = tmp_path / "nova.conf"
    conf.write_text("[filter_scheduler]\nenabled_filters = RetryFilter, ComputeFilter\n"
                    "[scheduler]\nmax_attempts = 3\n")
    proc, url = _serve(tmp_path / "b.sqlite", "--cloud", cloud, "--config-file", str(conf),
                       "--fail-host", "big", "--fail-host", "mid", "--fail-first", "small=1")
    stopper.append(proc)
    _wait_up(proc, url)

    def boot() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "berth.cli", "boot", "--flavor", "m1.tiny",
                               "--url", url, "--json"], capture_output=True, text=True, timeout=60)

    first = boot()  # big, mid, small all fail: a fourth attempt is beyond max_attempts
    assert first.returncode == 6, first.stderr
    (failure,) = json.loads(first.stdout)["failed"]
    assert failure["tried"] == ["big", "mid", "small"]
    assert "Exceeded maximum number of retries (3)" in failure["error"]["message"]

    second = boot()
    assert second.returncode == 0, second.stderr
    (instance,) = json.loads(second.stdout)["instances"]
    assert instance["tried"] == ["big", "mid", "small"] and instance["host"] == "small"
    assert instance["alternates"] == []  # the scheduler chose small, not an alternate
    log = _stop(proc)
    assert "asking the scheduler again (attempt 2 of 3, RetryFilter excludes big/big)" in log
    assert "(attempt 3 of 3, RetryFilter excludes big/big, mid/mid)" in log
    assert "Traceback" not in log


def test_an_unknown_fail_host_is_refused_at_start_up(tmp_path: Path) -> None:
    proc, _ = _serve(tmp_path / "b.sqlite", "--cloud", _cloud(tmp_path), "--fail-host", "zz")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "berth serve: --fail-host zz: no compute host 'zz' (known: b1, f1)" in out
    # Refused before the file's hosts were stored: the mistyped option changed nothing.
    with sqlite3.connect(tmp_path / "b.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM resource_providers").fetchone() == (0,)
        assert conn.execute("SELECT COUNT(*) FROM berth_compute_nodes").fetchone() == (0,)


def test_the_group_option_reaches_a_running_server(
        tmp_path: Path, stopper: list[subprocess.Popen[str]],
        capsys: pytest.CaptureFixture[str]) -> None:
    proc, url = _serve(tmp_path / "b.sqlite", "--cloud", _cloud(tmp_path))
    stopper.append(proc)
    _wait_up(proc, url)
    assert main(["boot", "--flavor", "web", "--group", "nosuch", "--url", url]) == 3
    assert "hints.group: no server group named or with uuid 'nosuch' (known: web)" in \
        capsys.readouterr().err
    assert main(["boot", "--flavor", "web", "--group", "web", "--url", url, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["instances"][0]["host"] == "f1"  # b1 runs the group's member
