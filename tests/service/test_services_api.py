"""``/os-services`` and ``berth service``: an operator disables, enables and forces down
compute services of a running server, with Nova's rules for the body and Nova's
effects on scheduling, and the switches last across restarts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from berth.errors import InputError
from berth.service.api import SchedulerApp
from berth.service.conductor import FakeDriver, ServiceUnreachable
from berth.service.services_api import ServiceAdmin, parse_update, services_from_hosts
from berth.service.stack import Stack

from .builders import node, reopen
from .serving import berth_serve

ADMIN = {"X-Auth-Token": "admin"}
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cloud.yaml"


@pytest.mark.parametrize("body, field, text", [
    ([], None, "body: expected a JSON object"),
    ({}, "status", "nothing to update"),
    ({"disabled_reason": "x"}, "status", "nothing to update"),
    ({"status": "off"}, "status", "status: expected 'enabled' or 'disabled', got 'off'"),
    ({"status": "enabled", "disabled_reason": "x"}, "disabled_reason", "allowed only with"),
    ({"forced_down": True, "disabled_reason": "x"}, "disabled_reason", "allowed only with"),
    ({"status": "disabled", "disabled_reason": " "}, "disabled_reason", "non-blank"),
    ({"status": "disabled", "disabled_reason": "x" * 256}, "disabled_reason", "at most 255"),
    ({"status": "disabled", "disabled_reason": 5}, "disabled_reason", "got 5"),
    ({"forced_down": "yes"}, "forced_down", "forced_down: expected true or false, got 'yes'"),
    ({"forced_down": 1}, "forced_down", "got 1"),
    ({"status": "disabled", "zone": "az1"}, "zone", "unknown field(s) zone"),
])
def test_a_bad_body_names_its_field(body: Any, field: str | None, text: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_update(body)
    assert text in caught.value.message
    assert caught.value.details.get("field") == field


def test_good_bodies() -> None:
    assert parse_update({"status": "disabled"}) == (True, None, None)
    assert parse_update({"status": "disabled", "disabled_reason": "disks"}) == (
        True, "disks", None)
    assert parse_update({"status": "enabled", "forced_down": False}) == (False, None, False)
    assert parse_update({"forced_down": True}) == (None, None, True)


def test_a_host_of_several_nodes_is_one_service() -> None:
    rows = [
        {"host": "b", "nodename": "b", "zone": "az1", "disabled": False, "forced_down": False,
         "reporting": True, "last_seen_up": "2026-11-28T10:00:00.000000"},
        {"host": "a", "nodename": "a-n1", "zone": "nova", "disabled": False,
         "forced_down": False, "reporting": False, "last_seen_up": None},
        {"host": "a", "nodename": "a-n2", "zone": "nova", "disabled": True,
         "disabled_reason": "fans", "forced_down": False, "reporting": True,
         "last_seen_up": "2026-11-28T10:00:01.000000"},
    ]
    a, b = services_from_hosts(rows)
    assert (a["host"], a["status"], a["state"], a["disabled_reason"], a["nodes"],
            a["updated_at"]) == ("a", "disabled", "up", "fans", ["a-n1", "a-n2"],
                                 "2026-11-28T10:00:01.000000")
    assert (b["id"], b["binary"], b["zone"], b["status"], b["state"]) == (
        "b", "nova-compute", "az1", "enabled", "up")
    # What an agent just answered wins over a view that has not had its report yet.
    switched = {"b": {"disabled": False, "disabled_reason": None, "forced_down": True}}
    assert services_from_hosts(rows, switched)[1]["state"] == "down"


def _client(stack: Stack, driver: FakeDriver | None = None) -> httpx.Client:
    service = stack.scheduler(seed=3)
    app = SchedulerApp(service, stack.conductor(service, driver), stack.placement_app,
                       groups=stack.groups)
    return httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://berth",
                        headers=ADMIN)


def test_a_disabled_or_forced_down_host_gets_no_boot_until_set_back(stack: Stack) -> None:
    stack.register_hosts([node("h1"), node("h2")])
    client = _client(stack, FakeDriver(agents=stack.agents))
    answer = client.put("/os-services/h1", json={"status": "disabled",
                                                 "disabled_reason": "new disks"})
    assert answer.status_code == 200, answer.text
    service = answer.json()["service"]
    assert (service["status"], service["disabled_reason"], service["state"]) == (
        "disabled", "new disks", "up")
    assert "COMPUTE_STATUS_DISABLED" in stack.client.get_provider_traits(
        stack.agents["h1"].uuid)[1]
    assert client.put("/os-services/h2", json={"forced_down": True}).json()[
        "service"]["state"] == "down"
    refused = client.post("/boot", json={"flavor": "m1.tiny"})
    assert refused.status_code == 409
    listed = {s["host"]: s for s in client.get("/os-services").json()["services"]}
    assert (listed["h1"]["status"], listed["h2"]["forced_down"]) == ("disabled", True)
    assert client.get("/os-services/h2").json()["service"]["state"] == "down"
    client.put("/os-services/h1", json={"status": "enabled"})
    assert client.post("/boot", json={"flavor": "m1.tiny"}).json()["instances"][0][
        "host"] == "h1"
    assert "COMPUTE_STATUS_DISABLED" not in stack.client.get_provider_traits(
        stack.agents["h1"].uuid)[1]
    assert client.get("/os-services/h1").json()["service"]["disabled_reason"] is None


def test_unknown_hosts_unreachable_agents_and_non_admins_are_refused(stack: Stack) -> None:
    stack.register_hosts([node("h1")])

    class Unreachable(FakeDriver):
        def set_service(self, host: str, **switches: Any) -> list[dict[str, Any]]:
            raise ServiceUnreachable(f"the compute agent of host {host!r} did not answer")

    client = _client(stack, Unreachable(agents=stack.agents))
    answer = client.put("/os-services/h1", json={"forced_down": True})
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "berth.compute.unreachable"
    client = _client(stack, FakeDriver(agents=stack.agents))
    missing = client.put("/os-services/nope", json={"forced_down": True})
    assert (missing.status_code, missing.json()["error"]["code"]) == (
        404, "berth.input.service_not_found")
    assert client.get("/os-services/nope").status_code == 404
    member = {"X-Auth-Token": "alice:demo"}
    assert client.get("/os-services", headers=member).status_code == 403
    assert client.put("/os-services/h1", json={"forced_down": True},
                      headers=member).status_code == 403
    assert client.delete("/os-services/h1").status_code == 405


def test_a_switch_on_a_host_the_scheduler_has_no_report_of_yet_answers_the_agents_state(
        stack: Stack) -> None:
    stack.register_hosts([node("h1")])
    service = stack.scheduler(seed=3)
    app = SchedulerApp(service, stack.conductor(service, FakeDriver(agents=stack.agents)),
                       stack.placement_app, hosts_view=lambda: {"hosts": []})
    client = httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://berth",
                          headers=ADMIN)
    answer = client.put("/os-services/h1", json={"status": "disabled", "disabled_reason": "x"})
    assert answer.status_code == 200, answer.text
    assert {k: answer.json()["service"][k] for k in ("host", "status", "disabled_reason",
                                                      "state", "nodes")} == {
        "host": "h1", "status": "disabled", "disabled_reason": "x", "state": "down",
        "nodes": ["h1"]}
    assert stack.agents["h1"].disabled


def test_the_switches_come_back_with_a_restarted_agent(stack: Stack) -> None:
    stack.register_hosts([node("h1"), node("h2")])
    stack.agents["h1"].set_service(disabled=True, reason="fans")
    stack.agents["h2"].set_service(forced_down=True)
    again = reopen(stack)
    try:
        h1, h2 = again.register_hosts([node("h1"), node("h2")])
        assert (h1.disabled, h1.disabled_reason, h1.forced_down) == (True, "fans", False)
        assert (h2.disabled, h2.forced_down) == (False, True)
        assert "COMPUTE_STATUS_DISABLED" in again.client.get_provider_traits(h1.uuid)[1]
    finally:
        again.close()


def _admin_client(stack: Stack, driver: FakeDriver) -> httpx.Client:
    service = stack.scheduler(seed=3)
    app = SchedulerApp(service, stack.conductor(service, driver), stack.placement_app,
                       groups=stack.groups, services=ServiceAdmin(
                           driver=driver, placement=stack.client, records=stack.records))
    return httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://berth",
                        headers=ADMIN)


def test_a_deleted_service_leaves_placement_the_records_and_the_scheduler(
        stack: Stack) -> None:
    stack.register_hosts([node("h1"), node("h2"), node("h3")])
    driver = FakeDriver(agents=stack.agents)
    client = _admin_client(stack, driver)
    built = client.post("/boot", json={"flavor": "m1.tiny", "force_hosts": ["h1"]})
    assert built.status_code == 200, built.text
    refused = client.delete("/os-services/h1")
    assert refused.status_code == 409
    assert "hosts 1 instance(s)" in refused.json()["error"]["message"]
    h2 = stack.agents["h2"].uuid
    assert client.delete("/os-services/h2").status_code == 204
    assert client.delete("/os-services/h2").status_code == 404
    assert sorted(client.get("/os-services").json()["services"][i]["host"]
                  for i in range(2)) == ["h1", "h3"]
    assert [h["host"] for h in client.get("/hosts").json()["hosts"]] == ["h1", "h3"]
    assert "h2" not in stack.agents and stack.records.report_of(h2) is None
    assert h2 not in {p.uuid for p in stack.client.list_providers()}
    for _ in range(3):  # the others still take boots
        assert client.post("/boot", json={"flavor": "m1.tiny"}).json()["instances"][0][
            "host"] in ("h1", "h3")
    # The host's agent starts again: it registers anew, as a Nova compute does.
    stack.register_hosts([node("h2")])
    assert sorted(h["host"] for h in client.get("/hosts").json()["hosts"]) == [
        "h1", "h2", "h3"]


def test_a_host_with_nested_providers_goes_children_first(stack: Stack) -> None:
    from berth.provider_tree import ProviderSpec

    vgpu = {"VGPU": {"total": 4, "reserved": 0, "min_unit": 1, "max_unit": 4,
                     "step_size": 1, "allocation_ratio": 1.0}}
    stack.register_hosts([node("h1", children=[
        ProviderSpec("numa0"), ProviderSpec("gpu0", resources=vgpu, parent="numa0")]),
        node("h2")])
    assert len(stack.client.list_providers()) == 4
    client = _admin_client(stack, FakeDriver(agents=stack.agents))
    assert client.delete("/os-services/h1").status_code == 204
    assert [p.name for p in stack.client.list_providers()] == ["h2"]


def test_a_service_whose_providers_hold_allocations_or_whose_agent_is_mute_stays(
        stack: Stack) -> None:
    stack.register_hosts([node("h1")])
    h1 = stack.agents["h1"].uuid
    consumer = "00000000-0000-4000-8000-0000000000c1"
    stack.client.put_allocations(consumer, {h1: {"VCPU": 1}}, project_id="p", user_id="u",
                                 consumer_generation=None)
    client = _admin_client(stack, FakeDriver(agents=stack.agents))
    refused = client.delete("/os-services/h1")
    assert refused.status_code == 409
    assert "holds allocations (VCPU=1)" in refused.json()["error"]["message"]
    stack.client.delete_allocations(consumer)

    class Unreachable(FakeDriver):
        def retire_service(self, host: str) -> list[str]:
            raise ServiceUnreachable(f"the compute agent of host {host!r} did not answer")

    client = _admin_client(stack, Unreachable(agents=stack.agents))
    refused = client.delete("/os-services/h1")
    assert (refused.status_code, refused.json()["error"]["code"]) == (
        409, "berth.compute.unreachable")
    assert "h1" in stack.agents and stack.records.report_of(h1) is not None
    assert h1 in {p.uuid for p in stack.client.list_providers()}


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "berth.cli", "service", *args, "--url", url],
                          capture_output=True, text=True, timeout=60)


def test_berth_service_against_berth_serve_and_its_restart(tmp_path: Path) -> None:
    """As an operator runs it: ``berth service`` against ``berth serve --cloud``, then a
    restart with the same file keeps what the operator set."""
    with berth_serve(tmp_path, "--cloud", str(EXAMPLE)) as url:
        done = _cli(url, "set", "c1-s01", "--disable", "--disable-reason", "new disks")
        assert done.returncode == 0, done.stderr
        assert "disabled" in done.stdout and "new disks" in done.stdout
        assert _cli(url, "set", "c1-s02", "--down").returncode == 0
        bad = _cli(url, "set", "c1-s02", "--enable", "--disable-reason", "x")
        assert bad.returncode == 3 and "disabled_reason" in bad.stderr
        assert _cli(url, "set", "c1-s02").returncode == 2
        for host in ("c1-s01", "c1-s02"):
            refused = httpx.post(url + "/boot", headers=ADMIN, timeout=60, json={
                "flavor": "m1.tiny", "force_hosts": [host]})
            assert refused.status_code == 409, refused.text
    with berth_serve(tmp_path, "--cloud", str(EXAMPLE)) as url:
        listed = _cli(url, "list")
        assert listed.returncode == 0
        rows = {line.split()[0]: line for line in listed.stdout.splitlines()}
        assert "disabled" in rows["c1-s01"] and "new disks" in rows["c1-s01"]
        assert " down " in rows["c1-s02"] and " yes " in rows["c1-s02"]
        assert _cli(url, "set", "c1-s01", "--enable").returncode == 0
        assert _cli(url, "set", "c1-s02", "--up").returncode == 0
        built = httpx.post(url + "/boot", headers=ADMIN, timeout=60, json={
            "flavor": "m1.tiny", "force_hosts": ["c1-s02"]})
        assert built.status_code == 200, built.text


def test_berth_service_delete_against_berth_serve(tmp_path: Path) -> None:
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text('hosts:\n  - {host: "n{index}", count: 3, vcpus: 8, memory_mb: 16384, '
                     "local_gb: 100}\n")
    with berth_serve(tmp_path, "--cloud", str(cloud)) as url:
        built = httpx.post(url + "/boot", headers=ADMIN, timeout=60, json={
            "flavor": "m1.tiny", "force_hosts": ["n1"]})
        assert built.status_code == 200, built.text
        refused = _cli(url, "delete", "n1")
        assert refused.returncode == 4 and "hosts 1 instance(s)" in refused.stderr
        done = _cli(url, "delete", "n2")
        assert done.returncode == 0 and "deleted" in done.stdout, done.stderr
        listed = _cli(url, "list").stdout
        assert "n1" in listed and "n3" in listed and "n2" not in listed
        providers = httpx.get(url + "/placement/resource_providers", headers=ADMIN,
                              timeout=30).json()["resource_providers"]
        assert sorted(p["name"] for p in providers) == ["n1", "n3"]
        assert _cli(url, "delete", "n2").returncode == 4  # 404: gone


def test_berth_service_list_of_a_server_without_hosts_prints_the_header(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from berth.cli import main

    monkeypatch.setattr(httpx, "request",
                        lambda *a, **k: httpx.Response(200, json={"services": []}))
    assert main(["service", "list"]) == 0
    assert capsys.readouterr().out.split()[:3] == ["Host", "Zone", "Status"]
