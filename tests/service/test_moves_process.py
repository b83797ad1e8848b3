"""Moves through a running ``berth serve``: the ``/servers`` routes and the ``berth
migrate|resize|evacuate|rebuild|live-migrate|confirm-resize|revert-resize|server``
commands, with the instance and migration consumers' allocations checked in the
Placement API."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from berth.cli import main

from .serving import berth_serve

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}

CLOUD = """
flavors:
  - {name: small, vcpus: 1, memory_mb: 1024, root_gb: 10}
  - {name: big, vcpus: 2, memory_mb: 2048, root_gb: 20}
images:
  - {name: x86, properties: {hw_architecture: x86_64}}
  - {name: arm, properties: {hw_architecture: aarch64}}
host_defaults:
  supported_instances: [[x86_64, kvm, hvm]]
hosts:
  - {host: n1, vcpus: 8, memory_mb: 8704, local_gb: 100}
  - {host: n2, vcpus: 8, memory_mb: 12800, local_gb: 100}
  - {host: n3, vcpus: 8, memory_mb: 16896, local_gb: 100,
     instances: [{uuid: 0b8f9c3e-0000-4000-8000-0000000000aa, flavor: small, image: x86}]}
  - {host: n4, vcpus: 8, memory_mb: 8704, local_gb: 100, service: {up: false},
     instances: [{uuid: 0b8f9c3e-0000-4000-8000-0000000000bb, flavor: small}]}
server_groups:
  - {name: pair, policy: anti-affinity}
"""
SEEDED = "0b8f9c3e-0000-4000-8000-0000000000aa"
ON_DOWN_HOST = "0b8f9c3e-0000-4000-8000-0000000000bb"
CONF = """
[filter_scheduler]
enabled_filters = ComputeFilter,ImagePropertiesFilter,ServerGroupAntiAffinityFilter
weight_classes = RAMWeigher
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's directory (its SQLite database is ``b.sqlite`` there)."""
    return tmp_path_factory.mktemp("moves")


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[str]:
    tmp = workdir
    (tmp / "cloud.yaml").write_text(CLOUD)
    (tmp / "nova.conf").write_text(CONF)
    with berth_serve(tmp, "--cloud", str(tmp / "cloud.yaml"), "--config-file",
                     str(tmp / "nova.conf"), "--seed", "3") as url:
        yield url


def _held(url: str, consumer: str) -> dict[str, dict[str, int]]:
    """A consumer's allocations by host name, from the Placement API."""
    headers = {"OpenStack-API-Version": "placement 1.28", "X-Auth-Token": "admin"}
    names = {p["uuid"]: p["name"] for p in httpx.get(
        f"{url}/placement/resource_providers", headers=headers).json()["resource_providers"]}
    allocations = httpx.get(f"{url}/placement/allocations/{consumer}", headers=headers).json()
    return {names[rp]: a["resources"] for rp, a in allocations["allocations"].items()}


SMALL = {"VCPU": 1, "MEMORY_MB": 1024, "DISK_GB": 10}
BIG = {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 20}


def test_migrate_and_confirm_through_the_api(server: str) -> None:
    booted = httpx.post(f"{server}/boot", json={"flavor": "small"}, headers=ADMIN).json()["instances"][0]
    uuid = booted["instance_uuid"]
    assert booted["host"] == "n3"  # the most free RAM
    resp = httpx.post(f"{server}/servers/{uuid}/migrate", json={"explain": True}, headers=ADMIN)
    assert resp.status_code == 200, resp.text
    moved = resp.json()
    assert (moved["host"], moved["status"], moved["source"]["host"]) == ("n2", "VERIFY_RESIZE", "n3")
    assert moved["diagnosis"]["instances"][0]["steps"][1]["name"] == "ignore_hosts"
    migration = moved["migration_uuid"]
    assert _held(server, uuid) == {"n2": SMALL}
    assert _held(server, migration) == {"n3": SMALL}
    shown = httpx.get(f"{server}/servers/{uuid}", headers=ADMIN).json()
    assert shown["migrations"][0]["status"] == "finished"
    confirmed = httpx.post(f"{server}/servers/{uuid}/confirm-resize", headers=ADMIN).json()
    assert confirmed["status"] == "ACTIVE"
    assert _held(server, migration) == {}
    assert _held(server, uuid) == {"n2": SMALL}


def test_resize_and_revert_with_the_cli(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["resize", SEEDED, "--flavor", "big", "--url", server]) == 0
    out = capsys.readouterr().out
    assert f"resize: {SEEDED} n3 -> " in out and "status VERIFY_RESIZE" in out
    assert "migration consumer" in out
    dest = out.split(" -> ")[1].split()[0]
    assert dest != "n3"
    assert _held(server, SEEDED) == {dest: BIG}
    assert main(["migrate", SEEDED, "--url", server]) == 4
    assert "VERIFY_RESIZE" in capsys.readouterr().err
    # While it waits: both consumers' holds, and the migration itself.
    assert main(["server", SEEDED, "--url", server]) == 0
    out = capsys.readouterr().out
    assert "status VERIFY_RESIZE" in out and "migration consumer" in out
    assert f"resize n3 -> {dest}, finished" in out
    assert main(["revert-resize", SEEDED, "--url", server]) == 0
    assert "on n3" in capsys.readouterr().out
    assert _held(server, SEEDED) == {"n3": SMALL}
    assert main(["server", SEEDED, "--url", server]) == 0
    out = capsys.readouterr().out
    assert "status ACTIVE; flavor small" in out and "migration consumer" not in out
    assert f"resize n3 -> {dest}, reverted" in out


def test_evacuate_from_a_down_host_and_not_from_an_up_one(
        server: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evacuate", SEEDED, "--url", server]) == 4
    assert "Compute service of n3 is still in use" in capsys.readouterr().err
    resp = httpx.post(f"{server}/servers/{ON_DOWN_HOST}/evacuate", json={"host": "n1"}, headers=ADMIN)
    assert resp.status_code == 200, resp.text
    assert resp.json()["host"] == "n1"
    # The instance consumer holds the down source and the destination.
    assert _held(server, ON_DOWN_HOST) == {"n1": SMALL, "n4": SMALL}


def test_rebuild_runs_the_image_filters_on_the_instance_host(
        server: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rebuild", SEEDED, "--image", "arm", "--explain", "--url", server]) == 4
    captured = capsys.readouterr()
    assert "No valid host was found" in captured.err
    assert "ImagePropertiesFilter" in captured.out
    assert main(["rebuild", SEEDED, "--image", "x86", "--url", server]) == 0
    assert _held(server, SEEDED) == {"n3": SMALL}


@pytest.mark.parametrize("path, body, status, message", [
    ("/servers/nope/migrate", {}, 404, "no such instance"),
    (f"/servers/{SEEDED}/migrate", {"host": 3}, 400, "host: expected a host name"),
    (f"/servers/{SEEDED}/migrate", {"flavor": "big"}, 400, "unknown field(s) flavor"),
    (f"/servers/{SEEDED}/migrate", {"host": "n9"}, 400, "compute host 'n9' could not be found"),
    (f"/servers/{SEEDED}/migrate", {"allow_cross_cell": "yes"}, 400, "allow_cross_cell: expected"),
    (f"/servers/{SEEDED}/resize", {}, 400, "flavor: required field is missing"),
    (f"/servers/{SEEDED}/resize", {"flavor": "small"}, 400, "already has flavor 'small'"),
    (f"/servers/{SEEDED}/resize", {"flavor": "nope"}, 400, "no flavor named 'nope'"),
    (f"/servers/{SEEDED}/rebuild", {"image": 5}, 400, "image: expected an image name"),
    (f"/servers/{SEEDED}/evacuate", {"allow_cross_cell": True}, 400, "unknown field(s)"),
    (f"/servers/{SEEDED}/confirm-resize", {"x": 1}, 400, "takes no fields"),
    (f"/servers/{SEEDED}/confirm-resize", {}, 409, "not VERIFY_RESIZE"),
    (f"/servers/{SEEDED}/shelve", {}, 404, "no action 'shelve'"),
], ids=["unknown instance", "host not a string", "a field migrate does not take",
        "unknown destination host", "a flag that is not a boolean", "resize without a flavor",
        "resize to the same flavor", "unknown flavor", "image not a name",
        "evacuate may not cross cells", "confirm with a body", "nothing to confirm",
        "unknown action"])
def test_bad_move_requests_get_one_line_errors(server: str, path: str, body: object,
                                               status: int, message: str) -> None:
    resp = httpx.post(server + path, json=body, headers=ADMIN)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"]["message"]
    assert "\n" not in resp.json()["error"]["message"]


def _usage(url: str, host: str) -> dict[str, int]:
    hosts = httpx.get(f"{url}/hosts", headers=ADMIN).json()["hosts"]
    entry = next(h for h in hosts if h["host"] == host)
    return {"vcpus_used": entry["vcpus_used"], "num_instances": entry["num_instances"]}


def test_delete_frees_the_allocations_the_host_and_the_group(
        server: str, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Churn online: DELETE /servers/{uuid} (and ``berth delete``) frees the instance's
    claims, its host reports it gone, and it leaves its server group; a resize waiting
    for confirmation gives up its source claim too. ``berth audit`` finds nothing amiss
    with a deleted instance (its build record is ``deleted``, not ``active`` without a
    claim)."""
    booted = []
    for _ in range(2):
        resp = httpx.post(f"{server}/boot", json={"flavor": "small", "hints": {"group": "pair"}},
                          headers=ADMIN)
        assert resp.status_code == 200, resp.text
        booted += resp.json()["instances"]
    first, second = (b["instance_uuid"] for b in booted)
    host = booted[0]["host"]
    before = _usage(server, host)
    resp = httpx.delete(f"{server}/servers/{first}", headers=ADMIN)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["status"] == "DELETED" and answer["host"] == host
    assert list(answer["freed"][first].values()) == [SMALL]
    assert _held(server, first) == {}
    deadline = time.monotonic() + 10
    while _usage(server, host)["num_instances"] != before["num_instances"] - 1:
        assert time.monotonic() < deadline, _usage(server, host)
        time.sleep(0.1)
    assert httpx.get(f"{server}/servers/{first}", headers=ADMIN).status_code == 404
    groups = httpx.get(f"{server}/server-groups", headers=ADMIN).json()["server_groups"]
    assert next(g for g in groups if g["name"] == "pair")["members"] == [second]
    assert httpx.delete(f"{server}/servers/{first}", headers=ADMIN).status_code == 404
    # A resize awaiting confirmation: both consumers' claims go.
    resized = httpx.post(f"{server}/servers/{second}/resize", json={"flavor": "big"},
                         headers=ADMIN).json()
    migration = resized["migration_uuid"]
    assert _held(server, migration) != {}
    assert main(["delete", second, "--url", server]) == 0
    out = capsys.readouterr().out
    assert f"{second}: deleted from {resized['host']}" in out
    assert f"freed from consumer {migration}: " in out
    assert _held(server, second) == {} and _held(server, migration) == {}
    assert main(["audit", "--db", f"sqlite:///{workdir}/b.sqlite", "--json"]) in (0, 8)
    findings = json.loads(capsys.readouterr().out)["findings"]
    flagged = {*findings["active_without_allocations"],
               *(h["consumer"] for h in findings["leaked"] + findings["orphaned"])}
    assert not flagged & {first, second, migration}, findings
    # Nobody without the rule deletes: a token with no role is refused.
    assert httpx.delete(f"{server}/servers/{SEEDED}",
                        headers={"X-Auth-Token": "mallory"}).status_code == 403


def test_live_migrate_with_the_cli_ends_on_the_destination_with_nothing_to_confirm(
        server: str, capsys: pytest.CaptureFixture[str]) -> None:
    resp = httpx.post(f"{server}/boot", json={"flavor": "small"}, headers=ADMIN)
    assert resp.status_code == 200, resp.text
    uuid = resp.json()["instances"][0]["instance_uuid"]
    source = resp.json()["instances"][0]["host"]
    before = _usage(server, source)["num_instances"]
    assert main(["live-migrate", uuid, "--url", server]) == 0
    out = capsys.readouterr().out
    assert f"live-migrate: {uuid} {source} -> " in out and "status ACTIVE" in out
    dest = out.split(" -> ")[1].split()[0]
    assert dest != source
    assert _held(server, uuid) == {dest: SMALL}
    shown = httpx.get(f"{server}/servers/{uuid}", headers=ADMIN).json()
    assert [(m["migration_type"], m["status"]) for m in shown["migrations"]] == [
        ("live-migration", "completed")]
    assert _held(server, shown["migrations"][0]["uuid"]) == {}
    # The source's compute let go of the instance and reported it.
    deadline = time.monotonic() + 10
    while _usage(server, source)["num_instances"] != before - 1:
        assert time.monotonic() < deadline, _usage(server, source)
        time.sleep(0.2)
    assert main(["confirm-resize", uuid, "--url", server]) == 4
    assert "not VERIFY_RESIZE" in capsys.readouterr().err
    # Bad input is one line.
    resp = httpx.post(f"{server}/servers/{uuid}/live-migrate", json={"flavor": "big"},
                      headers=ADMIN)
    assert resp.status_code == 400 and "unknown field(s) flavor for live-migrate" in resp.text
    # A member of the project may not live-migrate (admin or service, as Nova's rule).
    member = {"X-Auth-Token": "member", "X-Roles": "member", "X-Project-Id": "demo"}
    resp = httpx.post(f"{server}/servers/{uuid}/live-migrate", json={}, headers=member)
    assert resp.status_code == 403, resp.text


def test_drain_empties_a_host_through_the_cli(
        server: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``berth drain`` (POST /hosts/{host}/drain): every instance of n2 moved off,
    checked in the instance list and in Placement's usages of n2's provider."""
    for _ in range(2):
        resp = httpx.post(f"{server}/boot", json={"flavor": "small", "force_hosts": ["n2"]},
                          headers=ADMIN)
        assert resp.status_code == 200, resp.text
    on_n2 = [s["instance_uuid"] for s in httpx.get(f"{server}/servers", headers=ADMIN).json()[
        "servers"] if s["host"] == "n2"]
    assert len(on_n2) >= 2
    assert main(["drain", "n2", "--url", server]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "drain of n2 by live-migrate:"
    assert out.splitlines()[-1] == f"{len(on_n2)} moved, 0 left on n2"
    servers = httpx.get(f"{server}/servers", headers=ADMIN).json()["servers"]
    assert not [s for s in servers if s["host"] == "n2"]
    headers = {"OpenStack-API-Version": "placement 1.28", "X-Auth-Token": "admin"}
    (n2,) = [p["uuid"] for p in httpx.get(f"{server}/placement/resource_providers?name=n2",
                                          headers=headers).json()["resource_providers"]]
    usages = httpx.get(f"{server}/placement/resource_providers/{n2}/usages",
                       headers=headers).json()["usages"]
    assert usages.get("MEMORY_MB", 0) == 0 and usages.get("VCPU", 0) == 0
    # The web view lists each of the drain's moves as a single move is listed.
    decisions = httpx.get(f"{server}/decisions", headers=ADMIN).json()["decisions"]
    listed = {i["instance_uuid"] for d in decisions if d["operation"] == "live-migrate"
              for i in d["instances"] if i.get("source") == "n2"}
    assert set(on_n2) <= listed
    # JSON as sent; a bad body and an unknown host are one line; a member may not drain.
    assert main(["drain", "n2", "--url", server, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["moved"] == []
    resp = httpx.post(f"{server}/hosts/n2/drain", json={"operation": "rebuild"}, headers=ADMIN)
    assert resp.status_code == 400 and "operation: expected one of" in resp.text
    resp = httpx.post(f"{server}/hosts/n9/drain", json={}, headers=ADMIN)
    assert resp.status_code == 400 and "compute host 'n9' could not be found" in resp.text
    assert httpx.get(f"{server}/hosts/n2/drain", headers=ADMIN).status_code == 405
    # A host's name is read as sent (UTF-8); a path with more to it drains nothing.
    resp = httpx.post(f"{server}/hosts/h%C3%B4te/drain", json={}, headers=ADMIN)
    assert resp.status_code == 400 and "compute host 'hôte' could not be found" in \
        resp.json()["error"]["message"]
    for path in ("/hosts/n1/junk/drain", "/hosts/n1/x/y/drain", "/hosts/n1%2Fzz/drain"):
        assert httpx.post(server + path, json={}, headers=ADMIN).status_code == 404, path
    member = {"X-Auth-Token": "member", "X-Roles": "member", "X-Project-Id": "demo"}
    assert httpx.post(f"{server}/hosts/n2/drain", json={}, headers=member).status_code == 403
