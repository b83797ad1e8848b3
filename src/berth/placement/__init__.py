"""Berth's Placement-compatible resource store: schema, HTTP API 1.0-1.39, allocation candidates."""
