"""Placement's bounds of the numbers an inventory or allocation holds (its database's
INT, and the float its JSON schemas cap an allocation ratio at)."""

MAX_INT = 2147483647
MAX_FLOAT = 3.40282e38
