"""The scheduler HTTP API (in process) and the serve/boot command-line pieces."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from berth.cli import build_parser, main
from berth.errors import InputError
from berth.explain import Diagnosis
from berth.service.api import SchedulerApp
from berth.service.cli import diagnosis_from_dict, flavor_argument
from berth.service.compute import ComputeNodeSpec
from berth.service.seeding import seed_from_cloud
from berth.service.stack import Stack

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}


def _client(stack: Stack) -> httpx.Client:
    service = stack.scheduler(seed=3)
    app = SchedulerApp(service, stack.conductor(service), stack.placement_app)
    return httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://berth", headers=ADMIN)


def test_boot_places_and_builds_each_instance(stack: Stack) -> None:
    stack.register_hosts([ComputeNodeSpec(host=f"h{i}", vcpus=8, memory_mb=8704, local_gb=100)
                          for i in range(3)])
    with _client(stack) as http:
        resp = http.post("/boot", json={"flavor": "m1.tiny", "num": 2})
        assert resp.status_code == 200, resp.text
        instances = resp.json()["instances"]
        assert len(instances) == 2 and len({i["host"] for i in instances}) == 2
        first = instances[0]
        assert first["tried"] == [first["host"]]
        assert first["allocation_request_version"] == "1.36"
        assert all(a["host"] != first["host"] for a in first["alternates"])
        hosts = http.get("/hosts").json()["hosts"]
        assert sum(h["num_instances"] for h in hosts) == 2
        assert http.get("/placement/resource_providers",
                        headers={"X-Auth-Token": "admin"}).json()["resource_providers"]


@pytest.mark.parametrize("body, status, message", [
    ({"flavor": "nope"}, 400, "flavor: no flavor named 'nope'"),
    ({"flavor": {"vcpus": 0, "memory_mb": 1}}, 400, "flavor.vcpus: expected an integer from 1 to 2147483647, got 0"),
    ({"flavor": "m1.tiny", "num": "two"}, 400, "num: expected an integer from 1 to 1000"),
    ({"flavor": "m1.tiny", "colour": "red"}, 400, "unknown field(s) colour"),
    ({}, 400, "flavor: required field is missing"),
    ({"flavor": {"vcpus": 64, "memory_mb": 1}}, 409, "No valid host was found."),
    ({"flavor": "m1.tiny", "image": {"properties": {"hw_cpu_cores": "lots"}}}, 400,
     "image.properties.hw_cpu_cores: expected an integer, got 'lots'"),
    ({"flavor": "m1.tiny", "image": {"properties": {"os_secure_boot": "maybe"}}}, 400,
     "image.properties.os_secure_boot: expected one of required, disabled, optional, got 'maybe'"),
], ids=["unknown flavor name", "zero vcpus", "non-integer num", "unknown field",
        "missing flavor", "nothing fits", "non-integer image property",
        "image property outside its enum"])
def test_bad_boot_requests_get_clear_errors(stack: Stack, body: dict[str, object], status: int,
                                            message: str) -> None:
    stack.register_hosts([ComputeNodeSpec(host="h0", vcpus=8, memory_mb=8704, local_gb=100)])
    with _client(stack) as http:
        resp = http.post("/boot", json=body)
        assert resp.status_code == status
        assert message in resp.json()["error"]["message"]


def test_explain_returns_the_diagnosis_also_for_no_valid_host(stack: Stack) -> None:
    agents = stack.register_hosts([ComputeNodeSpec(host=f"h{i}", vcpus=8, memory_mb=8704,
                                                   local_gb=100) for i in range(2)])
    agents[0].report(now=agents[0].clock() - 3600)  # h0 is down: ComputeFilter rejects it
    with _client(stack) as http:
        answer = http.post("/boot", json={"flavor": "m1.tiny", "explain": True}).json()
        assert answer["instances"][0]["host"] == "h1" and answer["diagnosis"]["instances"]
        resp = http.post("/boot", json={"flavor": "m1.tiny", "explain": True,
                                        "ignore_hosts": ["h1"]})
        assert resp.status_code == 409 and resp.json()["diagnosis"] is not None


def test_invalid_json_and_unknown_routes(stack: Stack) -> None:
    with _client(stack) as http:
        resp = http.post("/boot", content=b"{not json", headers={"Content-Type": "application/json"})
        assert resp.status_code == 400 and "Malformed JSON" in resp.json()["error"]["message"]
        assert http.get("/boot").status_code == 405
        assert http.get("/nowhere").status_code == 404
        assert http.get("/healthz").json() == {"status": "ok"}


def test_flavor_argument_takes_a_name_or_three_numbers() -> None:
    assert flavor_argument("m1.small") == "m1.small"
    assert flavor_argument("2,4096,20") == {"name": "2,4096,20", "vcpus": 2, "memory_mb": 4096,
                                            "root_gb": 20}
    with pytest.raises(InputError, match="VCPUS,RAM_MB,DISK_GB"):
        flavor_argument("2,lots")


def test_serve_and_boot_are_berth_commands() -> None:
    args = build_parser().parse_args(["boot", "--flavor", "m1.tiny", "--hint", "group=g",
                                      "--num", "2"])
    assert args.flavor == "m1.tiny" and args.num == 2 and args.hint == ["group=g"]
    args = build_parser().parse_args(["serve", "--db", "sqlite:///x.sqlite", "--port", "0"])
    assert args.db == "sqlite:///x.sqlite" and args.port == 0


CLOUD = """
flavors:
  - {name: web, vcpus: 2, memory_mb: 2048, root_gb: 10}
aggregates:
  - {name: z1, availability_zone: az1, hosts: [a1]}
hosts:
  - {host: a1, vcpus: 8, memory_mb: 8704, local_gb: 100,
     instances: [{uuid: 0b8f9c3e-0000-4000-8000-000000000001, flavor: web}]}
  - {host: a2, vcpus: 4, memory_mb: 8704, local_gb: 100, vcpus_used: 10}
  - {host: a3, vcpus: 8, memory_mb: 8704, local_gb: 100, service: {disabled: true}}
  - {host: a4, vcpus: 8, memory_mb: 8704, local_gb: 100, service: {up: false}}
  - {host: a5, vcpus: 8, memory_mb: 8704, local_gb: 100, service: {forced_down: true}}
"""


def test_a_cloud_file_is_seeded_through_the_agents(stack: Stack, tmp_path: Path) -> None:
    path = tmp_path / "cloud.yaml"
    path.write_text(CLOUD)
    flavors, _ = seed_from_cloud(stack, str(path))
    assert "web" in flavors
    a1, a2, a3 = (stack.agents[h] for h in ("a1", "a2", "a3"))
    assert stack.client.provider_usages(a1.uuid) == {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 10}
    # vcpus_used 10 on 4 vCPUs: held by consumers of at most max_unit (4) each.
    assert stack.client.provider_usages(a2.uuid)["VCPU"] == 10
    assert "COMPUTE_STATUS_DISABLED" in stack.client.get_provider_traits(a3.uuid)[1]
    assert stack.client.get_aggregates(a1.uuid)[1] == [stack.records.aggregates()[0].uuid]
    snap = stack.scheduler().feed.refresh()
    row = snap.row_of("a2")
    assert row is not None and snap.num("vcpus_used")[row] == 10
    down, forced = snap.row_of("a4"), snap.row_of("a5")
    assert stack.agents["a4"].silent and not stack.agents["a5"].silent
    assert snap.num("service_heartbeat")[down] < snap.num("service_heartbeat")[row] - 60
    assert bool(snap.num("service_forced_down")[forced])
    # Seeding twice does not double the allocations.
    seed_from_cloud(stack, str(path))
    assert stack.client.provider_usages(a1.uuid)["VCPU"] == 2


# ----------------------------------------------------------------- berth boot --explain
@pytest.fixture
def boot_cli(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Stack:
    """``berth boot`` posting to the in-process app instead of a server."""
    agents = stack.register_hosts([ComputeNodeSpec(host=f"h{i}", vcpus=8, memory_mb=8704,
                                                   local_gb=100) for i in range(2)])
    agents[0].report(now=agents[0].clock() - 3600)  # h0 is down: ComputeFilter rejects it
    client = _client(stack)

    def request(method: str, url: str, json: object = None, timeout: float = 0,
                headers: object = None) -> httpx.Response:
        assert (method, url.rsplit("/", 1)[-1]) == ("POST", "boot")
        return client.post("/boot", json=json)

    monkeypatch.setattr(httpx, "request", request)
    return stack


def test_boot_explain_on_no_valid_host_prints_the_schedule_explanation(
        boot_cli: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    h1 = boot_cli.agents["h1"]
    h1.report(now=h1.clock() - 3600)  # now both are down
    status = main(["boot", "--flavor", "m1.tiny", "--explain"])
    out, err = capsys.readouterr()
    assert status == 4
    assert "No valid host was found" in err and "(berth.scheduling.no_valid_host)" in err
    assert not out.lstrip().startswith("{")
    lines = out.splitlines()
    assert lines[0].startswith("instance 1 -> no host: 0/2 hosts available: ")
    step = next(line for line in lines if line.split()[:1] == ["ComputeFilter"])
    assert step.split()[1:4] == ["2", "->", "0"]
    assert lines[0].endswith(": 2 " + lines[-1].split(": ", 1)[1]) or "2 " in lines[0]
    assert {line.split(":")[0].strip() for line in lines if "/h" in line} == {"h0/h0", "h1/h1"}


def test_boot_explain_says_why_placement_returned_nothing(
        boot_cli: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["boot", "--flavor", "64,512,1", "--explain"]) == 4
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("instance 1 -> no host: 0/2 hosts available: 2 insufficient VCPU "
                             "in placement (requested 64")
    assert out[1].split() == ["placement", "2", "->", "0"]
    assert {line.split(":")[0].strip() for line in out[2:4]} == {"h0/h0", "h1/h1"}
    assert all("insufficient VCPU in placement (requested 64, free " in line for line in out[2:4])


def test_boot_explain_on_success_prints_the_explanation_after_the_placements(
        boot_cli: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["boot", "--flavor", "m1.tiny", "--explain"]) == 0
    out = capsys.readouterr().out
    assert '"steps"' not in out
    assert "instance 1 -> h1" in out and "1/2 hosts available" in out and "top hosts by weight" in out


def test_boot_json_stays_raw_also_for_no_valid_host(
        boot_cli: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["boot", "--flavor", "64,512,1", "--explain", "--json"]) == 4
    body = __import__("json").loads(capsys.readouterr().out)
    assert body["error"]["code"] == "berth.scheduling.no_valid_host"
    assert body["diagnosis"]["instances"][0]["steps"]


def test_an_api_diagnosis_rebuilds_into_the_same_explanation(stack: Stack) -> None:
    stack.register_hosts([ComputeNodeSpec(host=f"h{i}", vcpus=8, memory_mb=8704, local_gb=100)
                          for i in range(3)])
    with _client(stack) as http:
        data = http.post("/boot", json={"flavor": "m1.tiny", "num": 2, "explain": True}).json()
    rebuilt = diagnosis_from_dict(data["diagnosis"])
    assert isinstance(rebuilt, Diagnosis)
    assert rebuilt.to_dict() == data["diagnosis"]
    with pytest.raises(InputError):
        diagnosis_from_dict({"summary": "x"})



@pytest.mark.parametrize("argv, message", [
    (["delete", "../os-services/c1-x01"], "expected an instance uuid, got '../os-services/c1-x01'"),
    (["server", ""], "expected an instance uuid, got ''"),
    (["migrate", "a/b?c=d"], "expected an instance uuid"),
    (["service", "delete", "../servers/00000000-0000-4000-8000-00000000000a"],
     "expected a host name"),
    (["service", "set", "..", "--up"], "expected a host name, got '..'"),
    (["service", "set", "", "--up"], "expected a host name, got ''"),
    (["boot", "--flavor", "m1.tiny", "--url", "http://[::1"], "not a URL: 'http://[::1'"),
    (["capacity", "--url", "ftp://x"], "expected an http:// or https:// URL"),
    (["cloud", "export", "--url", "http://h:99999"], "port 99999 of 'http://h:99999'"),
])
def test_an_argument_that_would_name_another_route_is_refused(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The instance or host goes into the URL's path: '../os-services/h' once deleted a
    compute service through ``berth delete``."""
    if "--url" not in argv:
        argv = [*argv, "--url", "http://127.0.0.1:9"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_host_name_goes_into_the_path_quoted() -> None:
    from berth.service.cli import instance_uuid, url_segment

    assert url_segment("c1 s01?x#y%") == "c1%20s01%3Fx%23y%25"
    # As the server keeps it (an upper-case uuid found no instance).
    assert instance_uuid("6F1F7D0C1C554F0E9D1E6A3F1B0B8E11") == \
        "6f1f7d0c-1c55-4f0e-9d1e-6a3f1b0b8e11"
