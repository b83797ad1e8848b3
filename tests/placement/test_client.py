"""PlacementClient against a real server: the scheduler's query-and-claim path."""

from __future__ import annotations

import uuid

import pytest

from berth.placement.client import ConflictError, NotFoundError, PlacementClient
from placement.support import Server


def test_claim_flow_with_typed_errors(server: Server) -> None:
    with PlacementClient(server.url) as client:
        rp = client.create_provider(f"client-{uuid.uuid4()}")
        gen = client.set_inventories(
            rp.uuid, rp.generation, {"VCPU": {"total": 4}, "MEMORY_MB": {"total": 2048}}
        )
        gen = client.set_provider_traits(rp.uuid, gen, ["HW_CPU_X86_AVX"])
        agg = str(uuid.uuid4())
        gen = client.set_aggregates(rp.uuid, gen, [agg])
        assert client.get_aggregates(rp.uuid) == (gen, [agg])
        assert client.get_provider_traits(rp.uuid) == (gen, ["HW_CPU_X86_AVX"])
        assert [p.uuid for p in client.list_providers(member_of=agg)] == [rp.uuid]
        body = client.allocation_candidates(
            {"resources": "VCPU:2,MEMORY_MB:512", "required": "HW_CPU_X86_AVX", "member_of": agg}
        )
        assert [list(r["allocations"]) for r in body["allocation_requests"]] == [[rp.uuid]]
        consumer = str(uuid.uuid4())
        claim = {rp.uuid: {"VCPU": 2, "MEMORY_MB": 512}}
        client.put_allocations(
            consumer, claim, project_id="p", user_id="u", consumer_generation=None
        )
        with pytest.raises(ConflictError) as err:
            client.put_allocations(
                consumer, claim, project_id="p", user_id="u", consumer_generation=None
            )
        assert err.value.is_generation_conflict and err.value.status == 409
        assert "consumer generation conflict" in err.value.detail
        got = client.get_allocations(consumer)
        assert got.allocations == claim and got.consumer_generation == 1
        assert got.consumer_type == "INSTANCE"
        assert client.provider_usages(rp.uuid) == {"VCPU": 2, "MEMORY_MB": 512}
        assert client.project_usages("p")["INSTANCE"]["VCPU"] >= 2
        with pytest.raises(ConflictError) as full:
            client.put_allocations(
                str(uuid.uuid4()),
                {rp.uuid: {"VCPU": 3}},
                project_id="p",
                user_id="u",
                consumer_generation=None,
            )
        assert not full.value.is_generation_conflict
        client.delete_allocations(consumer)
        with pytest.raises(NotFoundError) as missing:
            client.get_provider(str(uuid.uuid4()))
        assert missing.value.code == "placement.undefined_code"
        assert client.create_trait("CUSTOM_CLIENT") is True
        assert client.create_resource_class("CUSTOM_CLIENT_RC") is True
        assert "CUSTOM_CLIENT" in client.list_traits(name="startswith:CUSTOM_CLIENT")
        client.delete_provider(rp.uuid)
