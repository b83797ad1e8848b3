"""The bodies of the scheduler API's requests (``POST /boot``, ``POST /server-groups``,
the flavor and image of a move), checked field by field before anything is scheduled:
a problem is an :class:`~berth.errors.InputError` naming the field (``flavor.vcpus``,
``hints.same_host``), which the API answers 400."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

from berth.errors import InputError
from berth.model.image_props import ImagePropertyError, show
from berth.model.request import (
    MAX_INSTANCES_PER_REQUEST,
    Flavor,
    ImageMeta,
    ImageMetaProps,
    InstanceGroup,
    RequestSpec,
)
from berth.placement.bounds import MAX_INT

#: Hints whose values Nova's API schema requires to be instance uuids.
UUID_HINTS = ("same_host", "different_host")


def _int(body: Mapping[str, Any], key: str, where: str, default: int | None = None,
         minimum: int = 0, maximum: int | None = None, *, in_range: bool = False) -> int:
    """``body[key]`` as an int from ``minimum`` (to ``maximum``: a count per request,
    or with ``in_range`` a range of its own)."""
    value = body.get(key, default)
    if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
            or (in_range and maximum is not None and value > maximum)):
        expected = (f"an integer >= {minimum}" if maximum is None
                    else f"an integer from {minimum} to {maximum}")
        raise InputError(f"{where}{key}: expected {expected}, got {show(value)}",
                         field=f"{where}{key}")
    if maximum is not None and value > maximum:
        raise InputError(f"{where}{key}: at most {maximum} per request, got {show(value)}",
                         field=f"{where}{key}")
    return value


#: The longest project id, user id or zone name: Nova's columns hold 255 characters.
MAX_NAME = 255


def _optional_str(body: Mapping[str, Any], key: str, default: str | None = None) -> str | None:
    value = body.get(key, default)
    if value is not None and not isinstance(value, str):
        raise InputError(f"{key}: expected a string, got {show(value)}", field=key)
    if value is not None and len(value) > MAX_NAME:
        raise InputError(f"{key}: at most {MAX_NAME} characters, got {len(value)}", field=key)
    return value


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(f"{where}: expected an object of strings, got {value!r}")
    return {str(k): str(v) for k, v in value.items()}


def parse_flavor(value: Any, flavors: Mapping[str, Flavor]) -> Flavor:
    """A flavor name known to the server, or an inline flavor object."""
    if isinstance(value, str):
        if value not in flavors:
            raise InputError(f"flavor: no flavor named {value!r}; known: {', '.join(sorted(flavors))}")
        return flavors[value]
    if not isinstance(value, Mapping):
        raise InputError(f"flavor: expected a flavor name or an object, got {value!r}")
    unknown = set(value) - {"name", "vcpus", "memory_mb", "root_gb", "ephemeral_gb", "swap",
                            "extra_specs", "id"}
    if unknown:
        raise InputError(f"flavor: unknown field(s) {', '.join(sorted(unknown))}")
    name = value.get("name", "custom")
    if not isinstance(name, str) or not 1 <= len(name) <= 255:
        raise InputError(f"flavor.name: expected a string of 1 to 255 characters, got "
                         f"{show(name)}", field="flavor.name")
    flavor_id = value.get("id")
    if not (flavor_id is None or (isinstance(flavor_id, str) and 1 <= len(flavor_id) <= 255)
            or (isinstance(flavor_id, int) and not isinstance(flavor_id, bool)
                and 0 <= flavor_id <= MAX_INT)):
        raise InputError(f"flavor.id: expected a string of 1 to 255 characters or an integer "
                         f"from 0 to {MAX_INT}, got {show(flavor_id)}", field="flavor.id")

    def size(key: str, minimum: int) -> int:  # Nova's flavor API bounds them alike
        return _int(value, key, "flavor.", None if minimum else 0, minimum=minimum,
                    maximum=MAX_INT, in_range=True)

    return Flavor(
        name=name, vcpus=size("vcpus", 1), memory_mb=size("memory_mb", 1),
        root_gb=size("root_gb", 0), ephemeral_gb=size("ephemeral_gb", 0), swap=size("swap", 0),
        id=flavor_id, extra_specs=_str_map(value.get("extra_specs"), "flavor.extra_specs"))


def parse_image(value: Any, images: Mapping[str, ImageMeta]) -> ImageMeta | None:
    """An image name known to the server, an inline image object, or None."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in images:
            raise InputError(f"image: no image named {value!r}")
        return images[value]
    if not isinstance(value, Mapping):
        raise InputError(f"image: expected an image name or an object, got {value!r}")
    unknown = set(value) - {"id", "name", "disk_format", "properties"}
    if unknown:
        raise InputError(f"image: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    for key in ("id", "name", "disk_format"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise InputError(f"image.{key}: expected a string, got {show(value[key])}",
                             field=f"image.{key}")
    props = value.get("properties")
    props = {} if props is None else props
    if not isinstance(props, Mapping):
        raise InputError(f"image.properties: expected an object, got {show(props)}")
    try:
        properties = ImageMetaProps(props)
    except ImagePropertyError as exc:
        raise ImagePropertyError(exc.key, exc.value, exc.problem,
                                 where=f"image.properties.{exc.key}") from None
    return ImageMeta(id=value.get("id"), name=value.get("name"),
                     disk_format=value.get("disk_format"), properties=properties)


def _str_list(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(f"{where}: expected a list of strings, got {show(value)}", field=where)
    return list(value) or None


def parse_hints(value: Any) -> dict[str, list[str]] | None:
    """Scheduler hints: each value a string or a list of strings (a string becomes a
    one-element list); ``same_host``/``different_host`` values instance uuids and
    ``group`` exactly one server group, as Nova's API schema requires."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InputError(f"hints: expected an object, got {show(value)}", field="hints")
    hints: dict[str, list[str]] = {}
    for key, item in value.items():
        where = f"hints.{key}"
        if isinstance(item, str):
            items = [item]
        elif isinstance(item, list) and all(isinstance(v, str) for v in item):
            items = list(item)
        else:
            raise InputError(f"{where}: expected a string or a list of strings, got {show(item)}",
                             field=where)
        if key in UUID_HINTS:
            for v in items:
                try:
                    uuidlib.UUID(v)
                except ValueError:
                    raise InputError(f"{where}: expected instance uuids, got {show(v)}",
                                     field=where) from None
        if key == "group" and len(items) != 1:
            raise InputError(f"{where}: expected one server group (its uuid or name), got "
                             f"{show(item)}", field=where)
        hints[str(key)] = items
    return hints or None


def parse_boot(body: Any, flavors: Mapping[str, Flavor], images: Mapping[str, ImageMeta]) -> RequestSpec:
    """The request spec of a ``POST /boot`` body (errors name the field)."""
    if not isinstance(body, Mapping):
        raise InputError("body: expected a JSON object")
    unknown = set(body) - {"flavor", "image", "hints", "num", "project_id", "user_id",
                           "availability_zone", "force_hosts", "ignore_hosts", "explain"}
    if unknown:
        raise InputError(f"body: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    if "flavor" not in body:
        raise InputError("flavor: required field is missing")
    if not isinstance(body.get("explain", False), bool):
        raise InputError(f"explain: expected true or false, got {show(body['explain'])}",
                         field="explain")
    return RequestSpec(
        flavor=parse_flavor(body["flavor"], flavors), image=parse_image(body.get("image"), images),
        scheduler_hints=parse_hints(body.get("hints")),
        num_instances=_int(body, "num", "", 1, minimum=1, maximum=MAX_INSTANCES_PER_REQUEST),
        project_id=_optional_str(body, "project_id", "demo") or "demo",
        user_id=_optional_str(body, "user_id", "demo") or "demo",
        availability_zone=_optional_str(body, "availability_zone"),
        force_hosts=_str_list(body.get("force_hosts"), "force_hosts"),
        ignore_hosts=_str_list(body.get("ignore_hosts"), "ignore_hosts"),
    )


def parse_server_group(body: Any) -> InstanceGroup:
    """A ``POST /server-groups`` body as a new group; InputError naming the field."""
    if not isinstance(body, Mapping):
        raise InputError("body: expected a JSON object", field="body")
    unknown = sorted(set(body) - {"name", "policy", "rules", "project_id", "user_id"})
    if unknown:
        raise InputError(f"{unknown[0]}: unknown field (name, policy, rules, project_id, "
                         "user_id)", field=unknown[0])
    name = body.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise InputError(f"name: expected a non-empty string of at most 255 characters, "
                         f"got {name!r}", field="name")
    policy = body.get("policy")
    if policy not in InstanceGroup.VALID_POLICIES:
        raise InputError(f"policy: expected one of {', '.join(InstanceGroup.VALID_POLICIES)}, "
                         f"got {policy!r}", field="policy")
    rules = body.get("rules") or {}
    if not isinstance(rules, Mapping):
        raise InputError(f"rules: expected an object, got {rules!r}", field="rules")
    for key, value in rules.items():
        if key != "max_server_per_host":
            raise InputError(f"rules.{key}: unknown rule (max_server_per_host)",
                             field=f"rules.{key}")
        if policy != "anti-affinity":
            raise InputError("rules.max_server_per_host: only with the anti-affinity policy",
                             field="rules.max_server_per_host")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"rules.max_server_per_host: expected an integer >= 1, got "
                             f"{value!r}", field="rules.max_server_per_host")
    project, user = body.get("project_id"), body.get("user_id")
    for key, value in (("project_id", project), ("user_id", user)):
        if value is not None and not isinstance(value, str):
            raise InputError(f"{key}: expected a string, got {value!r}", field=key)
    return InstanceGroup(policy=policy, uuid=str(uuidlib.uuid4()), name=name, rules=dict(rules),
                         project_id=project, user_id=user)
