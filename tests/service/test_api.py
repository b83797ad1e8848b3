"""The scheduler API checks every body field, builds each instance on its own, resolves
server groups, and shows why a host is up or down."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from berth.config import SchedulerConfig
from berth.model.request import MAX_INSTANCES_PER_REQUEST, Flavor, InstanceGroup
from berth.service.api import SchedulerApp
from berth.service.conductor import FakeDriver
from berth.service.stack import Stack

from .builders import node
from .conftest import fresh_stack

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}

UUID_A = "00000000-0000-4000-8000-00000000000a"


def _client(stack: Stack, driver: FakeDriver | None = None) -> httpx.Client:
    service = stack.scheduler(seed=3)
    app = SchedulerApp(service, stack.conductor(service, driver), stack.placement_app,
                       groups=stack.groups)
    return httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://berth", headers=ADMIN)


@pytest.mark.parametrize("body, message", [
    ({"num": MAX_INSTANCES_PER_REQUEST + 1}, "num: at most 1000 per request, got 1001"),
    ({"num": 10**12}, "num: at most 1000 per request"),
    ({"num": 0}, "num: expected an integer from 1 to 1000, got 0"),
    ({"availability_zone": 5}, "availability_zone: expected a string, got 5"),
    ({"availability_zone": ["az1"]}, "availability_zone: expected a string"),
    ({"explain": "yes"}, "explain: expected true or false, got 'yes'"),
    ({"project_id": 7}, "project_id: expected a string, got 7"),
    ({"user_id": {"a": 1}}, "user_id: expected a string"),
    ({"hints": ["a"]}, "hints: expected an object"),
    ({"hints": {"query": {"a": 1}}}, "hints.query: expected a string or a list of strings"),
    ({"hints": {"x": ["a", 1]}}, "hints.x: expected a string or a list of strings"),
    ({"hints": {"same_host": "not-a-uuid"}}, "hints.same_host: expected instance uuids, "
                                             "got 'not-a-uuid'"),
    ({"hints": {"different_host": [UUID_A, "x"]}}, "hints.different_host: expected instance "
                                                   "uuids, got 'x'"),
    ({"hints": {"group": ["g1", "g2"]}}, "hints.group: expected one server group"),
    ({"hints": {"group": "nope"}}, "hints.group: no server group named or with uuid 'nope'"),
    ({"image": {"name": "x", "os": "linux"}}, "image: unknown field(s) os"),
    ({"image": {"id": 5}}, "image.id: expected a string, got 5"),
    ({"image": {"disk_format": ["qcow2"]}}, "image.disk_format: expected a string"),
    ({"image": {"properties": []}}, "image.properties: expected an object"),
    ({"force_hosts": "h0"}, "force_hosts: expected a list of strings, got 'h0'"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_field_is_a_400_naming_it(stack: Stack, body: dict[str, object],
                                        message: str) -> None:
    stack.register_hosts([node("h0")])
    with _client(stack) as http:
        resp = http.post("/boot", json={"flavor": "m1.tiny", **body})
        assert resp.status_code == 400, resp.text
        assert message in resp.json()["error"]["message"]
    assert stack.client.provider_usages(stack.agents["h0"].uuid).get("VCPU", 0) == 0


def test_deeply_nested_json_is_malformed_json_not_a_500(stack: Stack) -> None:
    with _client(stack) as http:
        resp = http.post("/boot", content=b"[" * 100_000 + b"]" * 100_000,
                         headers={"Content-Type": "application/json"})
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == "body: Malformed JSON: nesting too deep"


@pytest.mark.parametrize("path, raw, message", [
    ("/boot", rb'{"flavor": "m1.tiny", "project_id": "\ud800"}',
     "project_id: the string holds an unpaired UTF-16 surrogate"),
    ("/boot", rb'{"flavor": "m1.tiny", "image": {"properties": {"os_distro": "x\udc00"}}}',
     "image.properties.os_distro: the string holds an unpaired UTF-16 surrogate"),
    ("/boot", rb'{"flavor": "m1.tiny", "hints": {"\ud800": "a"}}',
     "hints: a key holds an unpaired UTF-16 surrogate"),
    ("/boot", rb'{"flavor": "m1.tiny", "image": {"properties": {"x": 1180591620717411303424}}}',
     "image.properties.x: 1180591620717411303424 is out of the 64-bit integer range"),
    ("/boot", rb'{"flavor": {"vcpus": 1, "memory_mb": 512, "id": 1180591620717411303424}}',
     "flavor.id: 1180591620717411303424 is out of the 64-bit integer range"),
    ("/boot", rb'{"flavor": {"vcpus": 1, "memory_mb": 512, "id": 2147483648}}',
     "flavor.id: expected a string of 1 to 255 characters or an integer from 0 to 2147483647"),
    ("/boot", rb'{"flavor": {"vcpus": 4294967296, "memory_mb": 512}}',
     "flavor.vcpus: expected an integer from 1 to 2147483647, got 4294967296"),
    ("/boot", rb'{"flavor": {"vcpus": 1, "memory_mb": 512, "name": ["x"]}}',
     "flavor.name: expected a string of 1 to 255 characters"),
    ("/server-groups", rb'{"name": "\ud800", "policy": "affinity"}',
     "name: the string holds an unpaired UTF-16 surrogate"),
    ("/boot", b'{"flavor": "m1.tiny", "project_id": "\xed\xa0\x80"}',
     "body: Malformed JSON"),
    ("/boot", '{"flavor": "m1.tiny", "image": {"properties": {"x": 1180591620717411303424}}}'
     .encode("utf-16"), "body: Malformed JSON"),
    ("/boot", b'{"flavor": "m1.tiny", "availability_zone": "' + b"z" * 256 + b'"}',
     "availability_zone: at most 255 characters, got 256"),
], ids=["project", "image property", "hint key", "huge property", "huge flavor id",
        "flavor id", "flavor size", "flavor name", "group name", "encoded surrogate",
        "UTF-16 body", "long zone"])
def test_what_no_store_or_report_can_hold_is_a_400_and_the_host_stays_usable(
        stack: Stack, path: str, raw: bytes, message: str) -> None:
    """JSON that decodes but that no database, encoder or host report can take (an
    unpaired surrogate, an integer past 64 bits, a flavor past Nova's bounds) is refused
    where it comes in: it once broke the host it was built on for every later boot."""
    stack.register_hosts([node("h0")])
    with _client(stack) as http:
        resp = http.post(path, content=raw, headers={"Content-Type": "application/json"})
        assert resp.status_code == 400, resp.text
        assert message in resp.json()["error"]["message"]
        assert http.post("/boot", json={"flavor": "m1.tiny"}).status_code == 200


def test_a_spawn_whose_report_fails_leaves_the_agent_without_the_instance(
        stack: Stack) -> None:
    (agent,) = stack.register_hosts([node("h0")])
    publish = agent.records.publish

    def failing(*args: object, **kwargs: object) -> object:
        raise TypeError("Integer exceeds 64-bit range")

    agent.records.publish = failing  # type: ignore[method-assign]
    with pytest.raises(TypeError):
        agent.spawn(UUID_A, stack_flavor(), "p")
    agent.records.publish = publish  # type: ignore[method-assign]
    agent.report()
    with _client(stack) as http:
        assert http.post("/boot", json={"flavor": "m1.tiny"}).status_code == 200
    assert UUID_A not in agent.host_record(0.0).instances


def stack_flavor() -> Flavor:
    return Flavor(name="small", vcpus=1, memory_mb=512, root_gb=1)


def test_a_negative_content_length_is_refused(stack: Stack) -> None:
    app = SchedulerApp(stack.scheduler(), stack.conductor(stack.scheduler()), stack.placement_app)
    statuses: list[str] = []
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/boot", "CONTENT_LENGTH": "-1",
               "HTTP_X_AUTH_TOKEN": "admin",
               "wsgi.input": None}
    body = json.loads(b"".join(app(environ, lambda status, headers: statuses.append(status))))
    assert statuses == ["400 Bad Request"] and "Content-Length" in body["error"]["message"]


# ----------------------------------------------------------------- multi-create
def test_a_partly_failed_multi_create_is_a_409_listing_built_and_failed(
        one_attempt: Stack) -> None:
    with _client(one_attempt, FakeDriver(fail_hosts={"h2"}, agents=one_attempt.agents)) as http:
        resp = http.post("/boot", json={"flavor": "m1.tiny", "num": 2})
    assert resp.status_code == 409
    data = resp.json()
    assert data["error"]["code"] == "berth.scheduling.max_retries_exceeded"
    assert data["error"]["message"].startswith("1 of 2 instances not built (1 built): ")
    (built,) = data["instances"]
    (failed,) = data["failed"]
    assert built["host"] == "h1" and failed["tried"] == ["h2"]
    assert failed["error"]["code"] == "berth.scheduling.max_retries_exceeded"
    usages = {h: one_attempt.client.provider_usages(a.uuid).get("VCPU", 0)
              for h, a in one_attempt.agents.items()}
    assert usages == {"h0": 0, "h1": 1, "h2": 0}


# ----------------------------------------------------------------- server groups
GROUPS_CONFIG = SchedulerConfig.from_dict({"filter_scheduler": {
    "enabled_filters": ["ComputeFilter", "ServerGroupAffinityFilter",
                        "ServerGroupAntiAffinityFilter"],
    "weight_classes": ["RAMWeigher"]}})


@pytest.fixture
def grouped(template_db: Path, tmp_path: Path) -> Iterator[Stack]:
    """Three equal hosts, the group filters, an anti-affinity and an affinity group."""
    st = fresh_stack(template_db, tmp_path, GROUPS_CONFIG)
    st.register_hosts([node(f"h{i}") for i in range(3)])
    st.groups.put(InstanceGroup(policy="anti-affinity", name="spread",
                                uuid="aaaaaaaa-0000-4000-8000-000000000001"))
    st.groups.put(InstanceGroup(policy="affinity", name="pack",
                                uuid="aaaaaaaa-0000-4000-8000-000000000002"))
    yield st
    st.close()


def test_anti_affinity_holds_across_requests_and_members_are_recorded(grouped: Stack) -> None:
    with _client(grouped) as http:
        hosts = []
        for _ in range(3):
            resp = http.post("/boot", json={"flavor": "m1.tiny", "hints": {"group": "spread"}})
            assert resp.status_code == 200, resp.text
            hosts.append(resp.json()["instances"][0]["host"])
        assert sorted(hosts) == ["h0", "h1", "h2"]
        resp = http.post("/boot", json={"flavor": "m1.tiny",
                                        "hints": {"group": "aaaaaaaa-0000-4000-8000-000000000001"}})
        assert resp.status_code == 409 and "No valid host" in resp.json()["error"]["message"]
    (group,) = grouped.groups.find("spread")
    assert len(group.members) == 3


def test_affinity_follows_the_host_of_the_first_member(grouped: Stack) -> None:
    with _client(grouped) as http:
        first = http.post("/boot", json={"flavor": "m1.tiny", "hints": {"group": ["pack"]}})
        host = first.json()["instances"][0]["host"]
        # Without the group RAMWeigher would spread onto another host.
        later = http.post("/boot", json={"flavor": "m1.tiny", "num": 2,
                                         "hints": {"group": "pack"}})
        assert later.status_code == 200, later.text
        assert {i["host"] for i in later.json()["instances"]} == {host}


def test_a_group_hint_without_a_group_store_is_a_400(stack: Stack) -> None:
    service = stack.scheduler()
    app = SchedulerApp(service, stack.conductor(service), stack.placement_app)
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://b", headers=ADMIN) as http:
        resp = http.post("/boot", json={"flavor": "m1.tiny", "hints": {"group": "g"}})
    assert resp.status_code == 400 and resp.json()["error"]["message"].startswith("hints.group:")


# ----------------------------------------------------------------- /hosts
def test_hosts_show_why_compute_filter_passes_or_rejects_each_host(stack: Stack) -> None:
    up, silent, forced, disabled = stack.register_hosts(
        [node(h) for h in ("up", "silent", "forced", "disabled")])
    silent.report(now=silent.clock() - 3600)
    forced.forced_down = True
    forced.report()
    disabled.set_disabled(True, "maintenance")
    with _client(stack) as http:
        hosts = {h["host"]: h for h in http.get("/hosts").json()["hosts"]}
    assert hosts["up"]["up"] and hosts["up"]["heartbeat_age_s"] < 60
    assert not hosts["silent"]["up"] and hosts["silent"]["heartbeat_age_s"] >= 3600
    assert hosts["forced"]["forced_down"] and not hosts["forced"]["up"]
    assert not hosts["disabled"]["up"]
    assert hosts["disabled"]["disabled_reason"] == "maintenance"


def test_a_multi_create_refused_for_lack_of_hosts_says_how_many_fit(grouped: Stack) -> None:
    """Four members of an anti-affinity group on three hosts: three found a host, the
    claims were released, and the 409 says so."""
    with _client(grouped) as http:
        resp = http.post("/boot", json={"flavor": "m1.tiny", "num": 4,
                                        "hints": {"group": "spread"}})
    assert resp.status_code == 409
    error = resp.json()["error"]
    assert (error["instances_fit"], error["instances_requested"]) == (3, 4)
    assert all(grouped.client.provider_usages(a.uuid).get("VCPU", 0) == 0
               for a in grouped.agents.values())


@pytest.mark.parametrize("method, path, allow", [
    ("GET", "/boot", "POST"), ("TRACE", "/boot", "POST"), ("POST", "/hosts", "GET, HEAD"),
    ("DELETE", "/flavors", "GET, HEAD"), ("PUT", "/server-groups", "GET, POST, HEAD"),
    ("POST", "/healthz", "GET, HEAD"), ("PATCH", "/servers", "GET, HEAD"),
    ("PUT", f"/servers/{UUID_A}", "GET, DELETE, HEAD"),
    ("GET", f"/servers/{UUID_A}/migrate", "POST"),
    ("POST", "/os-services", "GET, HEAD"), ("DELETE", "/decisions", "GET, HEAD"),
    ("POST", "/decisions/3", "GET, HEAD"),
])
def test_a_route_asked_with_another_method_is_a_405_with_allow(
        stack: Stack, method: str, path: str, allow: str) -> None:
    service = stack.scheduler(seed=3)
    conductor = stack.conductor(service)
    app = SchedulerApp(service, conductor, stack.placement_app, groups=stack.groups,
                       moves=stack.moves(conductor))
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://berth",
                      headers=ADMIN) as http:
        resp = http.request(method, path)
        assert resp.status_code == 405, resp.text
        assert resp.headers["Allow"] == allow
        assert resp.json()["error"]["code"] == "berth.http.method"
        assert http.get("/nosuch").status_code == 404
