"""Berth's nova-scheduler endpoint on RabbitMQ, called as Nova's conductor calls it: a
plain oslo.messaging client on topic ``scheduler`` sending real RequestSpec primitives
at 4.5, the 4.4 form without ``return_objects``, the legacy 4.0 dicts, and a version
Berth does not serve; casts go to the host-state sink."""

from __future__ import annotations

import copy
import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from berth.config import SchedulerConfig
from berth.nova import primitives as prim
from berth.nova.rpc import TOPIC, NovaSchedulerEndpoint, serve
from berth.service.bus import Bus, _oslo_messaging
from berth.service.localcluster import rabbit_vhost
from berth.service.offline import offline_cloud

DATA = Path(__file__).resolve().parents[1] / "data" / "nova"
CLOUD = """
hosts:
  - {host: "c{index}", count: 3, vcpus: 8, memory_mb: 16384, local_gb: 200}
"""


def rabbit_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not rabbit_up(), reason="RabbitMQ is not running on "
                                "127.0.0.1:5672 (rabbitmq-server -detached starts it)")


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def aggregates_changed(self, aggregates: list[Any]) -> None:
        self.calls.append(("aggregates", aggregates))

    def aggregate_deleted(self, aggregate: Any) -> None:
        self.calls.append(("deleted", aggregate))

    def instances_changed(self, host: str, instances: Any) -> None:
        self.calls.append(("instances", (host, [(i.uuid, i.instance_type_id, i.project_id)
                                                for i in instances])))

    def instance_deleted(self, host: str, uuid: str) -> None:
        self.calls.append(("instance_deleted", (host, uuid)))

    def instances_synced(self, host: str, uuids: list[str]) -> None:
        self.calls.append(("synced", (host, uuids)))


@pytest.fixture(scope="module")
def wired(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A scheduler over a three-host cloud, served in a run-private virtual host (the
    topic's queue is named after the topic alone, so another test's scheduler on the
    same host would share it); a probe client like Nova's."""
    cloud = tmp_path_factory.mktemp("nova") / "cloud.yaml"
    cloud.write_text(CLOUD)
    exchange = f"nova_test_{uuid.uuid4().hex[:8]}"
    config = SchedulerConfig.default()
    with offline_cloud(str(cloud), config, now=1.7e9) as offline, \
            rabbit_vhost("berth_rpc") as url:
        service = offline.stack.scheduler(seed=1)
        sink = Sink()
        bus = Bus(url, exchange=exchange, timeout=30)
        server = serve(bus, NovaSchedulerEndpoint(service, sink), "berth-test")
        om = _oslo_messaging()
        client = om.get_rpc_client(bus.transport, om.Target(topic=TOPIC, version="4.0"),
                                   timeout=30)
        try:
            yield {"client": client, "stack": offline.stack, "sink": sink, "om": om,
                   "server": server}
        finally:
            bus.close()


def spec(flavor_mb: int = 512, vcpus: int = 1, instance: str | None = None) -> dict[str, Any]:
    primitive = json.loads((DATA / "request_spec_boot.json").read_text())
    data = primitive["nova_object.data"]
    data["flavor"]["nova_object.data"].update(memory_mb=flavor_mb, vcpus=vcpus)
    data["instance_uuid"] = instance or str(uuid.uuid4())
    return copy.deepcopy(primitive)


def test_select_destinations_4_5_claims_and_answers_selections(wired: dict[str, Any]) -> None:
    instance = str(uuid.uuid4())
    answer = wired["client"].prepare(version="4.5").call(
        {}, "select_destinations", spec_obj=spec(instance=instance),
        instance_uuids=[instance], return_objects=True, return_alternates=True)
    (hosts,) = answer
    assert [h["nova_object.name"] for h in hosts] == ["Selection"] * 3
    chosen = hosts[0]["nova_object.data"]
    assert chosen["service_host"] in {"c1", "c2", "c3"}
    assert hosts[0]["nova_object.version"] == "1.1"
    limits = chosen["limits"]
    assert limits["nova_object.name"] == "SchedulerLimits"
    assert set(limits["nova_object.data"]) == {"numa_topology", "vcpu", "disk_gb", "memory_mb"}
    # The chosen host is claimed, as Nova's scheduler claims it; alternates carry theirs.
    request = json.loads(chosen["allocation_request"])
    held = wired["stack"].client.get_allocations(instance).allocations
    assert held == {rp: body["resources"] for rp, body in request["allocations"].items()}
    assert held[chosen["compute_node_uuid"]] == {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}
    assert chosen["allocation_request_version"] == "1.36"
    for alternate in hosts[1:]:
        assert json.loads(alternate["nova_object.data"]["allocation_request"])["allocations"]


def test_without_return_objects_the_answer_is_the_legacy_dicts(wired: dict[str, Any]) -> None:
    instance = str(uuid.uuid4())
    answer = wired["client"].prepare(version="4.4").call(
        {}, "select_destinations", spec_obj=spec(instance=instance), instance_uuids=[instance])
    assert len(answer) == 1 and set(answer[0]) == {"host", "nodename", "limits"}
    assert wired["stack"].client.get_allocations(instance).allocations  # 4.4 still claims


def test_the_4_0_legacy_dicts_choose_hosts_and_claim_nothing(wired: dict[str, Any]) -> None:
    request_spec = {"instance_type": {"name": "m1.tiny", "vcpus": 1, "memory_mb": 512,
                                      "root_gb": 1, "ephemeral_gb": 0, "swap": 0,
                                      "extra_specs": {}, "flavorid": "1"},
                    "image": {"properties": {}}, "num_instances": 2,
                    "instance_properties": {"project_id": "p1", "user_id": "u1"}}
    answer = wired["client"].call({}, "select_destinations", request_spec=request_spec,
                                  filter_properties={"scheduler_hints": {},
                                                     "ignore_hosts": ["c1"]})
    assert len(answer) == 2 and all(a["host"] in {"c2", "c3"} for a in answer)


def test_a_request_for_no_instance_gets_no_selection(wired: dict[str, Any]) -> None:
    """Without instance uuids, Nova schedules ``num_instances`` hosts: none for 0."""
    primitive = spec()
    primitive["nova_object.data"]["num_instances"] = 0
    answer = wired["client"].prepare(version="4.3").call(
        {}, "select_destinations", spec_obj=primitive, return_objects=True)
    assert answer == []


def test_no_valid_host_travels_as_novas_exception(wired: dict[str, Any]) -> None:
    instance = str(uuid.uuid4())
    with pytest.raises(wired["om"].RemoteError) as caught:
        wired["client"].prepare(version="4.5").call(
            {}, "select_destinations", spec_obj=spec(flavor_mb=10**6, instance=instance),
            instance_uuids=[instance], return_objects=True, return_alternates=True)
    assert caught.value.exc_type == "NoValidHost"
    assert "No valid host was found" in caught.value.value
    assert not wired["stack"].client.get_allocations(instance).allocations


def test_a_newer_version_is_refused(wired: dict[str, Any]) -> None:
    for version in ("4.6", "5.0"):
        with pytest.raises(Exception) as caught:
            wired["client"].prepare(version=version).call(
                {}, "select_destinations", spec_obj=spec(), instance_uuids=[str(uuid.uuid4())],
                return_objects=True, return_alternates=False)
        assert "UnsupportedVersion" in type(caught.value).__name__ + str(
            getattr(caught.value, "exc_type", ""))


def test_casts_reach_the_host_state_feed(wired: dict[str, Any]) -> None:
    aggregate = prim.primitive("Aggregate", "1.3", {
        "id": 7, "uuid": str(uuid.uuid4()), "name": "fast", "hosts": ["c1"],
        "metadata": {"availability_zone": "az9"}})
    fanout = wired["client"].prepare(fanout=True, version="4.1")
    fanout.cast({}, "update_aggregates", aggregates=[aggregate])
    fanout.cast({}, "delete_aggregate", aggregate=aggregate)
    instance = prim.primitive("Instance", "2.8", {"uuid": "u-1", "host": "c2"})
    wired["client"].prepare(fanout=True, version="4.2").cast(
        {}, "update_instance_info", host_name="c2", instance_info=instance)
    wired["client"].prepare(fanout=True, version="4.2").cast(
        {}, "delete_instance_info", host_name="c2", instance_uuid="u-1")
    wired["client"].prepare(fanout=True, version="4.2").cast(
        {}, "sync_instance_info", host_name="c2", instance_uuids=["u-2", "u-3"])
    # A malformed cast is logged and dropped; the server keeps serving.
    fanout.cast({}, "update_aggregates", aggregates=[{"nova_object.name": "Flavor"}])
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(wired["sink"].calls) < 5:
        time.sleep(0.1)
    kinds = [k for k, _ in wired["sink"].calls]
    assert kinds == ["aggregates", "deleted", "instances", "instance_deleted", "synced"]
    (agg,) = wired["sink"].calls[0][1]
    assert agg.name == "fast" and agg.hosts == ("c1",) and agg.metadata == {
        "availability_zone": "az9"}
    assert wired["sink"].calls[4][1] == ("c2", ["u-2", "u-3"])
    assert wired["sink"].calls[2][1] == ("c2", [("u-1", None, None)])
    test_without_return_objects_the_answer_is_the_legacy_dicts(wired)
