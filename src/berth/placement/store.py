"""The Placement data store: every read and write of reference section 3 in SQL.

Each public method runs in its own transaction and raises ``berth.placement.errors``
with the reference's verbatim messages. Concurrency contract:

* generations are compare-and-swap in SQL
  (``UPDATE ... SET generation = generation + 1 WHERE id = ? AND generation = ?``);
  a zero rowcount means another writer won;
* an allocation write is one transaction: delete the consumer's old rows, re-read usage
  and inventory, check capacity, insert, then CAS every touched provider. A lost CAS
  retries the whole transaction (``allocation_conflict_retry_count``, 10);
* on SQLite write transactions start with ``BEGIN IMMEDIATE`` so writers serialize;
* every graph-affecting write logs the providers it changed (``berth_provider_changes``),
  which is how ``provider_graph()`` knows its cache is stale and what to patch: on SQLite
  numbered by ``berth_state.change_seq``, which the write bumps as its last statement; on
  PostgreSQL by transaction id, without a row every write locks (``change_log``); trait
  and class name changes also bump ``names_seq``.

Hot paths (``provider_graph()`` and the common ``write_allocations()``) run raw SQL on
DBAPI connections the store keeps; on PostgreSQL one call's statements travel as one
pipeline. A new consumer on a provider the cached graph knows is written in one round
trip *trusting the cache*, which is sound because every write that adds usage to a
provider or changes its inventory bumps its generation: the compare-and-swap on the
cached generation proves the cached inventory still holds and the usage can only have
dropped. After its own write, when no other change committed in between, the store
patches its cached graph instead of reading the change back.

The store is split into small modules; :class:`PlacementStore` composes their mixins:

* ``store_records`` -- record dataclasses (``ProviderRecord``, ``InventoryRecord``,
  ``ConsumerWrite``, ...), constants and small helpers;
* ``store_raw`` -- the raw-SQL hot path: :class:`RawConnection`, the ``_RAW_*``
  statements, the change log's usage-delta text;
* ``store_base`` -- ``StoreBase``: shared state and plumbing (transactions that bump the
  change counter, prebuilt statements, provider row helpers, the kept raw connections);
* ``store_providers`` -- resource providers;
* ``store_inventories`` -- inventories;
* ``store_traits`` -- aggregates, traits and resource classes;
* ``store_allocations`` -- usages, allocation reads and the general allocation write path;
* ``store_fast_writes`` -- the raw-SQL allocation write fast path;
* ``store_reshaper`` -- POST /reshaper;
* ``store_graph`` -- the cached provider graph (``provider_graph()``).

This module keeps exporting the names other modules import from it.
"""

from __future__ import annotations

from berth.placement.store_allocations import AllocationsMixin
from berth.placement.store_base import CHANGE_LOG_KEEP, INCREMENTAL_LIMIT
from berth.placement.store_fast_writes import FastWritesMixin
from berth.placement.store_graph import GraphMixin
from berth.placement.store_inventories import InventoriesMixin
from berth.placement.store_providers import ProvidersMixin
from berth.placement.store_raw import _PG_BUMP_AND_LOG_CHANGES as _PG_BUMP_AND_LOG_CHANGES
from berth.placement.store_raw import _RAW_BUMP_SEQ as _RAW_BUMP_SEQ
from berth.placement.store_raw import _RAW_CAS_RP as _RAW_CAS_RP
from berth.placement.store_raw import _RAW_CLASS_NAMES as _RAW_CLASS_NAMES
from berth.placement.store_raw import _RAW_LOG_CHANGES as _RAW_LOG_CHANGES
from berth.placement.store_raw import _RAW_NAMES_SEQ as _RAW_NAMES_SEQ
from berth.placement.store_raw import _RAW_PRUNE as _RAW_PRUNE
from berth.placement.store_raw import _RAW_TRAIT_NAMES as _RAW_TRAIT_NAMES
from berth.placement.store_raw import _SQLITE_STAMP as _SQLITE_STAMP
from berth.placement.store_raw import RawConnection, decode_usage_delta, encode_usage_delta
from berth.placement.store_raw import Unexpected as Unexpected
from berth.placement.store_raw import marks as marks
from berth.placement.store_records import (
    CONCURRENT_MSG,
    INCOMPLETE_ID,
    MAX_INT,
    RETRY_COUNT,
    STANDARD_RCS,
    UNSET,
    ConsumerAllocations,
    ConsumerWrite,
    InventoryRecord,
    ProviderFilters,
    ProviderRecord,
    inventory_from_body,
)
from berth.placement.store_records import _capacity_ok as _capacity_ok
from berth.placement.store_records import _fields as _fields
from berth.placement.store_reshaper import ReshaperMixin
from berth.placement.store_traits import TraitsMixin

# Besides these, the ``_name as _name`` imports above re-export the private names
# provider_writes and the tests import from here.
__all__ = [
    "CHANGE_LOG_KEEP",
    "CONCURRENT_MSG",
    "INCOMPLETE_ID",
    "INCREMENTAL_LIMIT",
    "MAX_INT",
    "RETRY_COUNT",
    "STANDARD_RCS",
    "UNSET",
    "ConsumerAllocations",
    "ConsumerWrite",
    "InventoryRecord",
    "PlacementStore",
    "ProviderFilters",
    "ProviderRecord",
    "RawConnection",
    "decode_usage_delta",
    "encode_usage_delta",
    "inventory_from_body",
]


class PlacementStore(
    ProvidersMixin,
    TraitsMixin,
    ReshaperMixin,
    InventoriesMixin,
    AllocationsMixin,
    FastWritesMixin,
    GraphMixin,
):
    """All Placement data operations over one SQLAlchemy engine."""
