"""Parsers for Placement's query-string mini-languages: ``resources``, ``member_of``, ``required``.

Pure functions; each raises ``errors.BadRequest`` with the reference's verbatim text
(sections 4.2 and 4.12). Shared by GET /resource_providers and usable by the
allocation-candidates engine for its per-group parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from berth.placement import errors
from berth.placement.schemas import normalize_uuid

_RESOURCES_FORM = (
    "Badly formed resources parameter. Expected resources query string parameter in form: "
    "?resources=VCPU:2,MEMORY_MB:1024. Got: {got}."
)


def parse_resources(value: str) -> dict[str, int]:
    """``VCPU:2,MEMORY_MB:1024`` -> ``{"VCPU": 2, "MEMORY_MB": 1024}`` (later keys win)."""
    if value.strip() == "":
        raise errors.BadRequest(_RESOURCES_FORM.format(got="empty string"))
    result: dict[str, int] = {}
    for item in value.split(","):
        if ":" not in item:
            raise errors.BadRequest(_RESOURCES_FORM.format(got=item))
        name, amount_text = item.split(":", 1)
        try:
            amount = int(amount_text)
        except ValueError:
            raise errors.BadRequest(
                f"Requested resource {name} expected positive integer amount. Got: {amount_text}."
            ) from None
        if amount < 1:
            raise errors.BadRequest(
                f"Requested resource {name} requires amount >= 1. Got: {amount}."
            )
        result[name] = amount
    return result


@dataclass(frozen=True, slots=True)
class MemberOf:
    """AND over ``required`` (each an any-of set of aggregate uuids), minus ``forbidden``."""

    required: tuple[frozenset[str], ...]
    forbidden: frozenset[str]


def parse_member_of(values: list[str], version: tuple[int, int], *, suffix: str = "") -> MemberOf:
    """Parse every ``member_of<suffix>`` value of a request (reference 4.2)."""
    if version < (1, 24) and len(values) > 1:
        raise errors.BadRequest(f"Multiple member_of{suffix} parameters are not supported")
    required: list[frozenset[str]] = []
    forbidden: set[str] = set()
    for value in values:
        if "," in value and not (value.startswith("in:") or value.startswith("!in:")):
            raise errors.BadRequest(
                "Multiple values for 'member_of' must be prefixed with the 'in:' or '!in:' "
                f"keyword using the valid microversion. Got: {value}"
            )
        is_forbidden = value.startswith("!")
        if is_forbidden:
            if version < (1, 32):
                raise errors.BadRequest(
                    "Forbidden member_of parameters are not supported in the specified microversion"
                )
            value = value[1:]
        if value.startswith("in:"):
            value = value[3:]
        aggs = value.split(",")
        for agg in aggs:
            if normalize_uuid(agg) is None:
                raise errors.BadRequest(
                    "Invalid query string parameters: Expected 'member_of' parameter to "
                    f"contain valid UUID(s). Got: {agg}"
                )
        if is_forbidden:
            forbidden.update(aggs)
        else:
            required.append(frozenset(aggs))
    return MemberOf(tuple(required), frozenset(forbidden))


@dataclass(frozen=True, slots=True)
class RequiredTraits:
    """AND over ``required`` (each an any-of set of trait names); none of ``forbidden``."""

    required: tuple[frozenset[str], ...]
    forbidden: frozenset[str]

    def names(self) -> set[str]:
        """Every trait name mentioned."""
        out: set[str] = set(self.forbidden)
        for group in self.required:
            out |= group
        return out


def parse_required(
    values: list[str], version: tuple[int, int], *, param: str = "required"
) -> RequiredTraits:
    """Parse ``required`` values: ``!`` from 1.22, ``in:`` and repetition from 1.39."""
    allow_forbidden = version >= (1, 22)
    allow_any = version >= (1, 39)
    if not allow_any:
        # Below 1.39 only the last occurrence counts.
        values = values[-1:]
    form = "HW_CPU_X86_VMX,!CUSTOM_MAGIC" if allow_forbidden else "HW_CPU_X86_VMX,CUSTOM_MAGIC"
    required: list[frozenset[str]] = []
    forbidden: set[str] = set()
    for value in values:
        if value.startswith("in:"):
            if not allow_any:
                raise errors.BadRequest(
                    "Invalid query string parameters: The format "
                    "'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' only supported since microversion "
                    f"1.39. Got: {value}"
                )
            names = [n.strip() for n in value[3:].split(",")]
            if not all(names):
                raise errors.BadRequest(
                    f"Invalid query string parameters: Expected '{param}' parameter value of "
                    f"the form: {form}. Got an empty trait in: {value}"
                )
            if any(n.startswith("!") for n in names):
                raise errors.BadRequest(
                    f"Invalid query string parameters: Expected '{param}' parameter value of "
                    f"the form: in:HW_CPU_X86_VMX,CUSTOM_MAGIC. Got: {value}"
                )
            required.append(frozenset(names))
            continue
        names = [n.strip() for n in value.split(",")]
        if not all(names):
            raise errors.BadRequest(
                f"Invalid query string parameters: Expected '{param}' parameter value of "
                f"the form: {form}. Got an empty trait in: {value}"
            )
        for name in names:
            if name.startswith("!"):
                if not allow_forbidden:
                    raise errors.BadRequest(
                        f"Invalid query string parameters: Expected '{param}' parameter "
                        f"value of the form: {form}. Got: {value}"
                    )
                # Several leading "!" collapse into one (reference quirk).
                stripped = name.lstrip("!")
                if not stripped:
                    raise errors.BadRequest(
                        f"Invalid query string parameters: Expected '{param}' parameter "
                        f"value of the form: {form}. Got an empty trait in: {value}"
                    )
                forbidden.add(stripped)
            else:
                required.append(frozenset([name]))
    return RequiredTraits(tuple(required), frozenset(forbidden))
