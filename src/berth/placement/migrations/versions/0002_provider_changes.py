"""Change log of touched providers, so the cached provider graph can refresh incrementally.

Revision ID: 0002_provider_changes
Revises: 0001_initial
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_provider_changes"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add berth_provider_changes and berth_state.full_seq."""
    op.create_table(
        "berth_provider_changes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("seq", sa.BigInteger, nullable=False, index=True),
        sa.Column("provider_id", sa.Integer, nullable=False),
    )
    with op.batch_alter_table("berth_state") as batch:
        batch.add_column(sa.Column("full_seq", sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    """Drop them again."""
    with op.batch_alter_table("berth_state") as batch:
        batch.drop_column("full_seq")
    op.drop_table("berth_provider_changes")
