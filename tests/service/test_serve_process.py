"""``berth serve`` as a real process, and ``berth boot`` against it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from berth.cli import main

from .serving import berth_serve, free_port

CLOUD = """
flavors:
  - {name: web, vcpus: 2, memory_mb: 2048, root_gb: 10}
hosts:
  - {host: "n{index}", count: 3, vcpus: 8, memory_mb: 8704, local_gb: 100}
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(CLOUD)
    with berth_serve(tmp_path, "--cloud", str(cloud)) as url:
        yield url


def test_boot_prints_the_placements(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["boot", "--flavor", "web", "--num", "2", "--url", server]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["#", "instance", "host", "node", "tried", "alternates"]
    assert len(out) == 3 and {line.split()[2] for line in out[1:]} <= {"n1", "n2", "n3"}
    assert main(["boot", "--flavor", "1,512,1", "--json", "--url", server]) == 0
    assert '"instances"' in capsys.readouterr().out
    assert main(["boot", "--flavor", "web", "--explain", "--url", server]) == 0
    out = capsys.readouterr().out
    assert "hosts available" in out and "ComputeFilter" in out and '"steps"' not in out


def test_boot_reports_scheduling_and_input_errors(server: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["boot", "--flavor", "64,1,1", "--url", server]) == 4
    assert "No valid host was found" in capsys.readouterr().err
    assert main(["boot", "--flavor", "64,1,1", "--explain", "--url", server]) == 4
    out = capsys.readouterr().out
    assert out.startswith("instance 1 -> no host: 0/3 hosts available: 3 insufficient VCPU")
    assert main(["boot", "--flavor", "nosuch", "--url", server]) == 3
    assert "no flavor named 'nosuch'" in capsys.readouterr().err


def test_boot_without_a_server_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["boot", "--flavor", "m1.tiny", "--url", f"http://127.0.0.1:{free_port()}"]) == 7
    assert "cannot reach" in capsys.readouterr().err


def test_hosts_stay_up_on_heartbeats_from_one_reporting_thread(tmp_path: Path) -> None:
    """200 hosts, a heartbeat every second, down after 3 s without one: the agents'
    reports come from one thread (not one per host), and their heartbeats alone keep
    every host up through several rounds."""
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(CLOUD.replace("count: 3", "count: 200"))
    conf = tmp_path / "nova.conf"
    conf.write_text("[DEFAULT]\nreport_interval = 1\nservice_down_time = 3\n")
    procs: list[subprocess.Popen[bytes]] = []
    with berth_serve(tmp_path, "--cloud", str(cloud), "--config-file", str(conf),
                     procs=procs) as url:
        with open(f"/proc/{procs[0].pid}/status") as fh:
            threads = next(int(ln.split()[1]) for ln in fh if ln.startswith("Threads:"))
        assert threads < 40
        time.sleep(4.5)  # past service_down_time since registration
        resp = httpx.post(url + "/boot", json={"flavor": "web", "num": 200, "explain": True},
                          headers={"X-Auth-Token": "admin"}, timeout=60)
        assert resp.status_code == 200, resp.text
        assert len(resp.json()["instances"]) == 200
