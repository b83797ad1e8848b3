"""Reading the change log on PostgreSQL by transaction, not by a counter.

Every graph-affecting write logs the providers it changed in ``berth_provider_changes``.
On SQLite, whose writers take turns, each write also bumps a counter
(``berth_state.change_seq``) and a cached graph remembers the counter it is current to.
On PostgreSQL that counter row would be locked by every write until its commit, WAL
flush included, so every registration and every claim of every process would wait for
the one before. There a write instead records its transaction id (``xid``) in its log
rows, and a reader remembers the snapshot it read the log in (``pg_current_snapshot()``
as text, ``xmin:xmax:running,...``): the next read takes the rows of transactions that
snapshot did not see (those it found running, and those from its ``xmax`` on), which
are exactly those that committed since, whatever order their numbers came in.

Two more facts come with every read, in the same snapshot: whether a change that needs
the graph loaded whole (``berth_state.full_xid``) or a prune of log rows the reader may
not have seen (``berth_state.pruned_xid``, at or above the old snapshot's oldest running
transaction) happened since. A prune only removes rows of transactions older than every
running one, so a reader that keeps up never has to reload for it. A third: whether the
server is still the one the old snapshot was taken on; transaction ids are only
comparable within one server's history (a failover or a restore can take them back).
"""

from __future__ import annotations

#: The server's identity: when its postmaster started (seconds since the epoch, as
#: text). A restart, a standby's promotion or a restore from a backup changes it; after
#: a failover to a standby that had not replayed everything, or a restore to an earlier
#: point, transaction ids go back below those a cached snapshot saw, and the log can no
#: longer say what that snapshot did not see.
PG_SERVER = "CAST(extract(epoch FROM pg_postmaster_start_time()) AS text)"
#: The previous snapshot as a ``pg_snapshot`` (first parameter of each statement).
_PREV1 = "WITH s AS (SELECT CAST(? AS pg_snapshot) AS prev) "
#: The same and the server it was taken on (:data:`PG_SERVER`, second parameter).
_PREV = "WITH s AS (SELECT CAST(? AS pg_snapshot) AS prev, CAST(? AS text) AS server) "
#: True when the reader must load the graph whole: another server than the previous
#: snapshot's, or a change that needs it, or a prune of rows that snapshot might not
#: have seen, committed since that snapshot.
_RELOAD_ALL = (
    "s.server <> " + PG_SERVER + " OR (b.full_xid <> 0 AND NOT pg_visible_in_snapshot("
    "CAST(CAST(b.full_xid AS text) AS xid8), s.prev)) "
    "OR b.pruned_xid >= CAST(CAST(pg_snapshot_xmin(s.prev) AS text) AS bigint)"
)
#: Log rows of transactions the previous snapshot did not see: those it found running
#: (its ``xip`` list: looked up by id) and those from its ``xmax`` on (a range that ends
#: at this snapshot's ``xmax``; the bound, redundant otherwise, is what makes PostgreSQL's
#: generic plan take the index). Rows of the transactions in between were seen, so a
#: transaction left open for long (an idle session) does not make every read scan the
#: rows written since it began.
_UNSEEN = (
    "((x.xid >= CAST(CAST(pg_snapshot_xmax(s.prev) AS text) AS bigint) "
    "AND x.xid < CAST(CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text) AS bigint)) "
    "OR x.xid = ANY(ARRAY(SELECT CAST(CAST(r AS text) AS bigint) "
    "FROM pg_snapshot_xip(s.prev) AS r)))"
)
#: The current snapshot, whether to reload whole, the names counter and the log rows
#: the previous snapshot did not see (their transaction id, provider, generation and
#: usage delta; at most ``{limit}`` of them, which :func:`pg_state_and_log` writes in:
#: as a parameter, PostgreSQL's generic plan for a small unknown limit scans the whole
#: log, 5 ms at 5,000 rows, instead of the index). With no such row, one row with NULLs
#: in those columns.
_PG_STATE_AND_LOG = (
    _PREV + "SELECT CAST(pg_current_snapshot() AS text), " + _RELOAD_ALL + ", b.names_seq, "
    "c.xid, c.provider_id, c.generation, c.usage_delta FROM s CROSS JOIN berth_state b "
    "LEFT JOIN LATERAL (SELECT x.xid, x.provider_id, x.generation, x.usage_delta "
    "FROM berth_provider_changes x WHERE " + _UNSEEN + " LIMIT {limit}) c ON TRUE "
    "WHERE b.id = 1"
)
#: The current snapshot, whether to reload whole and the names counter.
PG_STATE = (
    _PREV + "SELECT CAST(pg_current_snapshot() AS text), " + _RELOAD_ALL + ", b.names_seq "
    "FROM s CROSS JOIN berth_state b WHERE b.id = 1"
)
#: The providers changed by transactions the previous snapshot did not see.
PG_CHANGED_IDS = (
    _PREV1 + "SELECT DISTINCT x.provider_id FROM s CROSS JOIN berth_provider_changes x "
    "WHERE " + _UNSEEN
)
#: The current snapshot (in the shape of the state statements: nothing to reload), the
#: names counter and the server (:data:`PG_SERVER`), read first in a full load's snapshot.
PG_SNAPSHOT = (
    "SELECT CAST(pg_current_snapshot() AS text), FALSE, names_seq, " + PG_SERVER
    + " FROM berth_state WHERE id = 1"
)


def pg_state_and_log(limit: int) -> str:
    """The statement reading the current snapshot, the counters and at most ``limit``
    unseen log rows (parameters: the previous snapshot and its server)."""
    return _PG_STATE_AND_LOG.format(limit=int(limit))


def snapshot_sees(snapshot: str, xid: int) -> bool:
    """Whether a transaction's changes are visible in ``snapshot`` (the text of a
    ``pg_snapshot``, ``xmin:xmax:running,...``), as ``pg_visible_in_snapshot`` says:
    below ``xmin``, or below ``xmax`` and not running. False for no snapshot (``""``)."""
    if not snapshot:
        return False
    xmin, xmax, running = snapshot.split(":")
    if xid < int(xmin):
        return True
    return xid < int(xmax) and str(xid) not in running.split(",")


#: At start-up: forget log rows and markers whose transaction id this cluster has not
#: reached. They come from another cluster's history (a database restored from a
#: logical dump starts its transaction ids over): left, they would be read as new once
#: this cluster's ids pass theirs, and their usage deltas applied a second time. A
#: committed row of this cluster never has an id at or past the current ``xmax``.
PG_FORGET_FOREIGN = (
    "WITH cur AS (SELECT CAST(CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text) "
    "AS bigint) AS xmax), "
    "d AS (DELETE FROM berth_provider_changes WHERE xid >= (SELECT xmax FROM cur) "
    "RETURNING 1) "
    "UPDATE berth_state SET "
    "full_xid = CASE WHEN full_xid >= (SELECT xmax FROM cur) THEN 0 ELSE full_xid END, "
    "pruned_xid = CASE WHEN pruned_xid >= (SELECT xmax FROM cur) THEN 0 ELSE pruned_xid END "
    "WHERE id = 1 AND (full_xid >= (SELECT xmax FROM cur) "
    "OR pruned_xid >= (SELECT xmax FROM cur) OR EXISTS (SELECT 1 FROM d))"
)
