"""Alembic migration scripts of the Placement store (run automatically at start-up)."""
