"""Property tests on the store: capacity is never exceeded by a write, and the incrementally
refreshed provider graph always equals a graph rebuilt from scratch."""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from berth.placement import db, errors
from berth.placement.store import ConsumerWrite, InventoryRecord, PlacementStore

PROVIDERS = 3
CONSUMERS = list(range(4))
_ENGINE: list[Any] = []


def _engine() -> Any:
    """One migrated database for all examples (each example makes its own providers)."""
    if not _ENGINE:
        tmp = tempfile.mkdtemp(prefix="berth-prop-")
        engine = db.prepare(str(Path(tmp) / "prop.sqlite"))
        _ENGINE.append(engine)

        def _remove() -> None:  # the test process's end: the database goes with it
            engine.dispose()
            shutil.rmtree(tmp, ignore_errors=True)

        atexit.register(_remove)
    return _ENGINE[0]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("inventory"), st.integers(0, PROVIDERS - 1), st.integers(1, 8)),
        st.tuples(
            st.just("claim"),
            st.sampled_from(CONSUMERS),
            st.integers(0, PROVIDERS - 1),
            st.integers(1, 6),
        ),
        st.tuples(st.just("release"), st.sampled_from(CONSUMERS)),
        st.tuples(
            st.just("reparent"), st.integers(0, PROVIDERS - 1), st.integers(-1, PROVIDERS - 1)
        ),
        st.tuples(st.just("trait"), st.integers(0, PROVIDERS - 1), st.booleans()),
    ),
    max_size=10,
)


def _usage(store: PlacementStore, uuid: str) -> int:
    found = store.provider_usages(uuid)
    assert found is not None
    return found[1].get("VCPU", 0)


def _capacity(store: PlacementStore, uuid: str) -> int | None:
    found = store.get_inventories(uuid)
    assert found is not None
    inv = found[1].get("VCPU")
    return None if inv is None else inv.capacity


@settings(max_examples=12, deadline=None)
@given(ops=OPS)
def test_writes_respect_capacity_and_the_graph_cache_stays_exact(ops: list[Any]) -> None:
    engine = _engine()
    store = PlacementStore(engine)
    tag = uuid.uuid4().hex[:8]
    rps = [store.create_provider(f"rp{i}-{tag}", None, None).uuid for i in range(PROVIDERS)]
    consumers = [str(uuid.uuid4()) for _ in CONSUMERS]
    store.provider_graph()
    for step, op in enumerate(ops):
        kind = op[0]
        try:
            if kind == "inventory":
                _, i, total = op
                gen = store.get_provider(rps[i]).generation  # type: ignore[union-attr]
                store.set_inventories(
                    rps[i],
                    gen,
                    {"VCPU": InventoryRecord("VCPU", total, 0, 1, 8, 1, 1.0)},
                    (1, 39),
                )
            elif kind == "claim":
                _, c, i, amount = op
                consumer = consumers[c]
                before = _usage(store, rps[i])
                current = store.consumer_allocations(consumer)
                gen = current.consumer_generation if current.allocations else None
                store.write_allocations(
                    [ConsumerWrite(consumer, "p", "u", [(rps[i], "VCPU", amount)], "X", gen)],
                    post=False,
                )
                after = _usage(store, rps[i])
                cap = _capacity(store, rps[i])
                assert cap is not None
                # The write fits, or at least does not grow an existing overcommit.
                assert after <= cap or after <= before
            elif kind == "release":
                store.delete_consumer_allocations(consumers[op[1]])
            elif kind == "reparent":
                _, i, j = op
                parent = None if j < 0 else rps[j]
                store.update_provider(
                    rps[i],
                    f"rp{i}-{tag}",
                    set_parent=True,
                    parent_uuid=parent,
                    allow_reparent=True,
                )
            elif kind == "trait":
                _, i, on = op
                gen = store.get_provider(rps[i]).generation  # type: ignore[union-attr]
                store.set_provider_traits(rps[i], ["HW_CPU_X86_AVX"] if on else [], gen)
        except errors.PlacementError:
            pass  # rejected writes are fine; they must simply leave no trace
        if step % 2:
            store.provider_graph()  # refresh between some steps, accumulate across others
    cached = store.provider_graph()
    fresh = PlacementStore(engine).provider_graph()
    assert cached.providers == fresh.providers
