"""Placement microversions: parsing the ``OpenStack-API-Version`` header (reference 1.3)."""

from __future__ import annotations

from typing import NamedTuple

SERVICE = "placement"
HEADER = "openstack-api-version"


class Version(NamedTuple):
    """A microversion as ``(major, minor)``; compares as a tuple."""

    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


MIN_VERSION = Version(1, 0)
MAX_VERSION = Version(1, 39)


class InvalidVersion(Exception):
    """The version string is not ``X.Y`` (400)."""


class UnacceptableVersion(Exception):
    """The version is well formed but outside MIN..MAX (406)."""


def _parse_version_string(text: str) -> Version:
    """Parse ``X.Y``; the message carries Python's own int() complaint, as Placement's does."""
    try:
        # A split limited to one dot plus int() rejects "1.2.3" ('2.3' is not an int)
        # and "1" (missing minor) with Python's own wording, which clients match.
        return Version(*(int(part) for part in text.split(".", 1)))
    except (ValueError, TypeError) as exc:
        raise InvalidVersion(f"invalid version string: {text}; {exc}") from None


def extract_version(header_value: str | None) -> Version:
    """Return the placement microversion requested by an ``OpenStack-API-Version`` value.

    Entries are comma separated ``<service> <version>``; the service name is matched
    case-insensitively and the last placement entry wins. No entry means 1.0, ``latest``
    means the maximum. Raises InvalidVersion or UnacceptableVersion.
    """
    chosen: str | None = None
    if header_value:
        for entry in header_value.split(","):
            parts = entry.strip().split(None, 1)
            if len(parts) == 2 and parts[0].lower() == SERVICE:
                chosen = parts[1].strip()
    if chosen is None:
        return MIN_VERSION
    if chosen == "latest":
        return MAX_VERSION
    version = _parse_version_string(chosen)
    if not (MIN_VERSION <= version <= MAX_VERSION):
        raise UnacceptableVersion(f"Unacceptable version header: {chosen}")
    return version
