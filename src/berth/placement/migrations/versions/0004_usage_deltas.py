"""Usage deltas in the change log, so a cached provider graph follows another process's
allocation writes from the log alone instead of re-reading those providers.

Revision ID: 0004_usage_deltas
Revises: 0003_names_seq
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_usage_deltas"
down_revision = "0003_names_seq"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add berth_provider_changes.generation and .usage_delta (NULL: reload the provider,
    which is what every row written before this revision means)."""
    with op.batch_alter_table("berth_provider_changes") as batch:
        batch.add_column(sa.Column("generation", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("usage_delta", sa.Text, nullable=True))


def downgrade() -> None:
    """Drop them again."""
    with op.batch_alter_table("berth_provider_changes") as batch:
        batch.drop_column("usage_delta")
        batch.drop_column("generation")
