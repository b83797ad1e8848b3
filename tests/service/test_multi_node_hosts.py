"""``berth serve`` with a multi-node service host (Ironic-style), as a real process.

The issue-13 example online: service host ``ironic1`` with nodes ``node-a`` (running
instance I1) and ``node-b``, plus ``cmp2``. Each node has its own agent; the scheduler
sees ironic1's instances on both nodes, as Nova does, and so answers as `berth schedule`
does offline (tests/test_service_hosts.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from berth.cli import main

from .serving import berth_serve

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}

I1 = "00000000-0000-4000-8000-000000000001"
CLOUD = f"""
flavors:
  - {{name: small, vcpus: 1, memory_mb: 1024, root_gb: 10}}
hosts:
  - {{host: ironic1, nodename: node-a, vcpus: 16, memory_mb: 32768, local_gb: 400,
     instances: [{{uuid: {I1}, flavor: small}}]}}
  - {{host: ironic1, nodename: node-b, vcpus: 8, memory_mb: 16384, local_gb: 200}}
  - {{host: cmp2, vcpus: 4, memory_mb: 8192, local_gb: 100}}
server_groups:
  - {{name: apart, policy: anti-affinity}}
"""
NOVA_CONF = """
[filter_scheduler]
enabled_filters = ComputeFilter,SameHostFilter,DifferentHostFilter,ServerGroupAntiAffinityFilter
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "cloud.yaml").write_text(CLOUD)
    (tmp_path / "nova.conf").write_text(NOVA_CONF)
    with berth_serve(tmp_path, "--cloud", str(tmp_path / "cloud.yaml"), "--config-file",
                     str(tmp_path / "nova.conf"), "--seed", "1") as url:
        yield url


def boot(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> dict[str, object]:
    assert main(["boot", "--flavor", "small", "--json", "--url", url, *argv]) == 0
    return dict(json.loads(capsys.readouterr().out))


def nodes(url: str) -> dict[tuple[str, str], int]:
    """Instances each node reports (its own, per node)."""
    return {(h["host"], h["nodename"]): h["num_instances"]
            for h in httpx.get(url + "/hosts", headers=ADMIN).json()["hosts"]}


def test_a_multi_node_host_schedules_online_as_nova_and_berth_schedule_do(
        server: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Every node registered with its own agent; node-a reports the file's instance.
    assert nodes(server) == {("ironic1", "node-a"): 1, ("ironic1", "node-b"): 0,
                             ("cmp2", "cmp2"): 0}

    answer = boot(capsys, server, "--hint", f"different_host={I1}", "--explain")
    placed = answer["instances"][0]  # type: ignore[index]
    assert (placed["host"], placed["nodename"]) == ("cmp2", "cmp2")
    steps = answer["diagnosis"]["instances"][0]["steps"]  # type: ignore[index]
    step = next(s for s in steps if s["name"] == "DifferentHostFilter")
    assert {(r["host"], r["nodename"]) for r in step["rejections"]} == {
        ("ironic1", "node-a"), ("ironic1", "node-b")}

    answer = boot(capsys, server, "--hint", f"same_host={I1}", "--explain")
    step = next(s for s in answer["diagnosis"]["instances"][0]["steps"]  # type: ignore[index]
                if s["name"] == "SameHostFilter")
    assert step["hosts_out"] == 2
    assert [(r["host"], r["nodename"]) for r in step["rejections"]] == [("cmp2", "cmp2")]

    # Two instances into an anti-affinity group: the first lands on node-a (most free
    # resources), and its sibling node-b sees it, so the second goes to cmp2.
    answer = boot(capsys, server, "--group", "apart", "--num", "2")
    assert [(i["host"], i["nodename"]) for i in answer["instances"]] == [  # type: ignore[union-attr]
        ("ironic1", "node-a"), ("cmp2", "cmp2")]
    # Each build was reported by the agent of the node it was placed on (same_host went
    # to node-a as well, the roomiest of the two that passed).
    assert nodes(server) == {("ironic1", "node-a"): 3, ("ironic1", "node-b"): 0,
                             ("cmp2", "cmp2"): 2}
