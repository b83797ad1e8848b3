"""A names counter, so a cached provider graph re-reads trait and class names only when
one was created, deleted or renamed.

Revision ID: 0003_names_seq
Revises: 0002_provider_changes
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_names_seq"
down_revision = "0002_provider_changes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add berth_state.names_seq."""
    with op.batch_alter_table("berth_state") as batch:
        batch.add_column(sa.Column("names_seq", sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    """Drop it again."""
    with op.batch_alter_table("berth_state") as batch:
        batch.drop_column("names_seq")
