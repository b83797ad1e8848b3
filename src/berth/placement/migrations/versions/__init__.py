"""Alembic revisions of the Placement store, oldest first."""
