"""Initial Placement schema: providers, classes, traits, inventories, aggregates,
consumers, allocations and the change counter.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create every table of the store."""
    op.create_table(
        "resource_providers",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("uuid", sa.String(36), nullable=False, unique=True),
        sa.Column("name", sa.Unicode(200), nullable=False, unique=True),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("root_provider_id", sa.Integer, nullable=True, index=True),
        sa.Column("parent_provider_id", sa.Integer, nullable=True, index=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=True),
    )
    op.create_table(
        "resource_classes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(255), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime, nullable=True),
        sa.Column("updated_at", sa.DateTime, nullable=True),
    )
    op.create_table(
        "traits",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.Unicode(255), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime, nullable=True),
        sa.Column("updated_at", sa.DateTime, nullable=True),
    )
    op.create_table(
        "inventories",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("resource_provider_id", sa.Integer, nullable=False),
        sa.Column("resource_class_id", sa.Integer, nullable=False, index=True),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("reserved", sa.Integer, nullable=False),
        sa.Column("min_unit", sa.Integer, nullable=False),
        sa.Column("max_unit", sa.Integer, nullable=False),
        sa.Column("step_size", sa.Integer, nullable=False),
        sa.Column("allocation_ratio", sa.Float, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=True),
        sa.UniqueConstraint(
            "resource_provider_id", "resource_class_id", name="uniq_inventories0rp0rc"
        ),
    )
    op.create_table(
        "placement_aggregates",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("uuid", sa.String(36), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime, nullable=True),
    )
    op.create_table(
        "resource_provider_aggregates",
        sa.Column("resource_provider_id", sa.Integer, primary_key=True),
        sa.Column("aggregate_id", sa.Integer, primary_key=True, index=True),
    )
    op.create_table(
        "resource_provider_traits",
        sa.Column("resource_provider_id", sa.Integer, primary_key=True),
        sa.Column("trait_id", sa.Integer, primary_key=True, index=True),
    )
    op.create_table(
        "projects",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("external_id", sa.String(255), nullable=False, unique=True),
    )
    op.create_table(
        "users",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("external_id", sa.String(255), nullable=False, unique=True),
    )
    op.create_table(
        "consumer_types",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(255), nullable=False, unique=True),
    )
    op.create_table(
        "consumers",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("uuid", sa.String(36), nullable=False, unique=True),
        sa.Column("project_id", sa.Integer, nullable=False, index=True),
        sa.Column("user_id", sa.Integer, nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("consumer_type_id", sa.Integer, nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=True),
        sa.Column("updated_at", sa.DateTime, nullable=True),
    )
    op.create_table(
        "allocations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("resource_provider_id", sa.Integer, nullable=False),
        sa.Column("consumer_id", sa.String(36), nullable=False, index=True),
        sa.Column("resource_class_id", sa.Integer, nullable=False),
        sa.Column("used", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=True),
        sa.Column("updated_at", sa.DateTime, nullable=True),
    )
    op.create_index(
        "allocations_rp_rc_idx", "allocations", ["resource_provider_id", "resource_class_id"]
    )
    op.create_table(
        "berth_state",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("change_seq", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    """Drop every table of the store."""
    for name in (
        "berth_state",
        "allocations",
        "consumers",
        "consumer_types",
        "users",
        "projects",
        "resource_provider_traits",
        "resource_provider_aggregates",
        "placement_aggregates",
        "inventories",
        "traits",
        "resource_classes",
        "resource_providers",
    ):
        op.drop_table(name)
