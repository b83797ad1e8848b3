"""The change log on PostgreSQL without a counter row every write locks.

Every graph-affecting write used to bump ``berth_state.change_seq`` in its own
transaction, so on PostgreSQL every write (a registration's three, every claim) held
that one row's lock through its commit, WAL flush included: writes from any number of
processes ran one at a time, and the waits cost the database more CPU than the writes.
From this revision a PostgreSQL write numbers its log rows from a sequence and records
its transaction id (``xid``); a reader keeps the snapshot it read the log in and next
reads the rows of transactions that snapshot did not see. ``full_xid`` and
``pruned_xid`` say the same of a change that needs a full reload and of the log's
pruned rows. SQLite, whose writers take turns anyway, keeps the counter.

Upgrading: stop every process of a PostgreSQL store before any starts on this version.
A process of an earlier version bumps the counter and logs without transaction ids,
which processes of this version do not read, and it does not read theirs.

Revision ID: 0005_xid_changes
Revises: 0004_usage_deltas
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_xid_changes"
down_revision = "0004_usage_deltas"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add berth_provider_changes.xid (indexed), berth_state.full_xid and .pruned_xid,
    and on PostgreSQL the sequence the log's numbers come from (continuing the counter).
    Log rows written before have no xid: a reader started after the upgrade loads the
    graph whole first, so it never needs them."""
    with op.batch_alter_table("berth_provider_changes") as batch:
        batch.add_column(sa.Column("xid", sa.BigInteger, nullable=True))
        batch.create_index("ix_berth_provider_changes_xid", ["xid"])
    with op.batch_alter_table("berth_state") as batch:
        batch.add_column(sa.Column("full_xid", sa.BigInteger, nullable=False, server_default="0"))
        batch.add_column(
            sa.Column("pruned_xid", sa.BigInteger, nullable=False, server_default="0"))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE SEQUENCE berth_change_seq")
        op.execute("SELECT setval('berth_change_seq', "
                   "(SELECT change_seq + 1 FROM berth_state WHERE id = 1), false) "
                   "WHERE EXISTS (SELECT 1 FROM berth_state WHERE id = 1)")


def downgrade() -> None:
    """Drop them again (the counter continues from the sequence)."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute("UPDATE berth_state SET change_seq = "
                   "(SELECT last_value FROM berth_change_seq) WHERE id = 1")
        op.execute("DROP SEQUENCE berth_change_seq")
    with op.batch_alter_table("berth_state") as batch:
        batch.drop_column("pruned_xid")
        batch.drop_column("full_xid")
    with op.batch_alter_table("berth_provider_changes") as batch:
        batch.drop_index("ix_berth_provider_changes_xid")
        batch.drop_column("xid")
