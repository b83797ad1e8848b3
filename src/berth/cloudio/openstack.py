"""Read a real OpenStack cloud (``berth cloud import``) through openstacksdk.

openstacksdk does the authentication (``clouds.yaml`` or ``OS_*`` variables, Keystone
v3), the service catalog and version discovery; the importer reads the APIs' own JSON
through the SDK's authenticated adapters, at explicit microversions, so nothing a cloud
returns is renamed or dropped on the way:

==========================================  ===========  ====================================
what                                        microversion  gives
==========================================  ===========  ====================================
``GET /os-hypervisors/detail``              2.88          nodes: uuid, service host, type,
                                                          version, host_ip
``GET /os-hypervisors/detail``              2.87          cpu_info, disk_available_least,
                                                          current_workload (io_workload) and
                                                          the compute's own sizes (for a node
                                                          placement does not know)
``GET /os-services?binary=nova-compute``    2.69          enabled/disabled (and why), forced
                                                          down, up/down
``GET /os-aggregates``                      2.81          aggregates: uuid, AZ, metadata, hosts
``GET /flavors/detail?is_public=None``      2.75          flavors with extra specs (2.61), else
                                                          ``GET /flavors/{id}/os-extra_specs``
``GET /os-server-groups?all_projects=True`` 2.64          policy, rules, members
``GET /servers/detail?all_tenants=1``       2.100         host, node, flavor (by name, 2.47),
                                                          image, project
Image API ``GET /v2/images``                -             images with their properties
Placement (:mod:`berth.cloudio.placement`)  1.39          providers, inventories, traits,
                                                          aggregates, allocations
==========================================  ===========  ====================================

Each microversion is capped at the server's maximum; an older cloud answers in its
older shapes, which are read too (``policies`` before 2.64, a flavor id before 2.47,
the sizes in the 2.88 listing itself before 2.88). The caller needs the admin role.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from berth.cloudio import placement
from berth.cloudio.state import CloudState, ComputeNode, Server, names_list
from berth.errors import CloudSourceError

#: The microversion each compute read asks for (capped at the server's maximum).
MICROVERSIONS = {"hypervisors": "2.88", "legacy_hypervisors": "2.87", "services": "2.69",
                 "aggregates": "2.81", "flavors": "2.75", "server_groups": "2.64",
                 "servers": "2.100"}

#: Glance's own image fields; every other key of an image is a property.
GLANCE_FIELDS = {"id", "name", "status", "visibility", "protected", "checksum", "owner",
                 "size", "min_ram", "min_disk", "disk_format", "container_format",
                 "created_at", "updated_at", "tags", "virtual_size", "self", "file",
                 "schema", "direct_url", "locations", "os_hidden", "os_hash_algo",
                 "os_hash_value", "stores"}

#: The fields each compute object has up to microversion 2.100; others are warned about.
KNOWN_FIELDS = {
    "hypervisor": {"id", "hypervisor_hostname", "state", "status", "hypervisor_type",
                   "hypervisor_version", "host_ip", "service", "uptime", "servers", "cpu_info",
                   "current_workload", "disk_available_least", "free_disk_gb", "free_ram_mb",
                   "local_gb", "local_gb_used", "memory_mb", "memory_mb_used", "running_vms",
                   "vcpus", "vcpus_used"},
    "service": {"id", "binary", "host", "zone", "status", "state", "updated_at",
                "disabled_reason", "forced_down"},
    "aggregate": {"id", "uuid", "name", "availability_zone", "hosts", "metadata", "created_at",
                  "updated_at", "deleted_at", "deleted"},
    "flavor": {"id", "name", "vcpus", "ram", "disk", "swap", "OS-FLV-EXT-DATA:ephemeral",
               "OS-FLV-DISABLED:disabled", "os-flavor-access:is_public", "rxtx_factor",
               "links", "description", "extra_specs"},
    "server group": {"id", "name", "policy", "policies", "rules", "members", "metadata",
                     "project_id", "user_id"},
    "server": {"id", "name", "status", "tenant_id", "user_id", "metadata", "hostId", "image",
               "flavor", "created", "updated", "addresses", "accessIPv4", "accessIPv6",
               "links", "key_name", "config_drive", "progress", "fault", "description",
               "tags", "locked", "locked_reason", "host_status", "security_groups",
               "trusted_image_certificates", "server_groups", "pinned_availability_zone",
               "scheduler_hints", "OS-DCF:diskConfig", "OS-EXT-AZ:availability_zone",
               "OS-EXT-SRV-ATTR:host", "OS-EXT-SRV-ATTR:hostname",
               "OS-EXT-SRV-ATTR:hypervisor_hostname", "OS-EXT-SRV-ATTR:instance_name",
               "OS-EXT-SRV-ATTR:kernel_id", "OS-EXT-SRV-ATTR:launch_index",
               "OS-EXT-SRV-ATTR:ramdisk_id", "OS-EXT-SRV-ATTR:reservation_id",
               "OS-EXT-SRV-ATTR:root_device_name", "OS-EXT-SRV-ATTR:user_data",
               "OS-EXT-STS:power_state", "OS-EXT-STS:task_state", "OS-EXT-STS:vm_state",
               "os-extended-volumes:volumes_attached", "OS-SRV-USG:launched_at",
               "OS-SRV-USG:terminated_at"},
}

#: ``limit`` of each page asked for (Nova's default ``max_limit`` is 1000).
PAGE = 1000


class OpenStackAPI:
    """GETs against one cloud's compute, image and placement APIs through an
    openstacksdk connection (``openstack.connect(cloud=NAME)``)."""

    def __init__(self, connection: Any, name: str) -> None:
        self.conn = connection
        self.name = name

    @classmethod
    def connect(cls, cloud: str | None = None) -> OpenStackAPI:
        """Connect as ``clouds.yaml``'s ``cloud`` (or the ``OS_*`` variables) say."""
        try:
            import openstack
            import openstack.exceptions
        except ImportError:
            raise CloudSourceError(
                "berth cloud import needs openstacksdk, which is not installed: "
                "pip install 'berth[openstack]'") from None
        # The SDK warns about its own internals (deprecations nobody here can act on),
        # and keystoneauth logs each failed discovery before the error that says it all.
        warnings.filterwarnings("ignore", module=r"openstack(\.|$)")
        if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
            for chatty in ("keystoneauth", "openstack"):
                logging.getLogger(chatty).setLevel(logging.ERROR)
        try:
            conn = openstack.connect(cloud=cloud)
        except openstack.exceptions.SDKException as exc:
            raise CloudSourceError(f"--os-cloud {cloud or '(OS_* variables)'}: {_one_line(exc)}") from None
        return cls(conn, cloud or "OS_* environment")

    def _get(self, service: str, path: str, microversion: str | None = None) -> Any:
        from keystoneauth1 import exceptions as ksa

        adapter = getattr(self.conn, service)
        try:
            resp = adapter.get(path, microversion=microversion, raise_exc=False)
        except ksa.ClientException as exc:
            raise CloudSourceError(f"{self.name}: {service} GET {path}: {_one_line(exc)}") from None
        except Exception as exc:  # the SDK's own (catalog, discovery): one line, no trace
            raise CloudSourceError(f"{self.name}: {service} GET {path}: {_one_line(exc)}") from None
        if resp.status_code != 200:
            why = " (the import needs the admin role)" if resp.status_code in (401, 403) else ""
            raise CloudSourceError(f"{self.name}: {service} GET {path} answered "
                                   f"{resp.status_code}{why}: {resp.text[:200]}",
                                   status=resp.status_code)
        try:
            return resp.json()
        except ValueError:
            raise CloudSourceError(f"{self.name}: {service} GET {path} answered no JSON") from None

    def compute(self, path: str, microversion: str | None) -> Any:
        """``GET`` on the compute API at ``microversion``."""
        return self._get("compute", path, microversion)

    def image(self, path: str) -> Any:
        """``GET`` on the image API (v2)."""
        return self._get("image", path)

    def placement(self, path: str) -> Any:
        """``GET`` on the placement API at the reader's microversion."""
        return self._get("placement", path, placement.MICROVERSION)

    def compute_max_version(self) -> str | None:
        """The newest compute microversion the cloud supports (None: no microversions)."""
        try:
            data = self.conn.compute.get_endpoint_data()
        except Exception as exc:
            raise CloudSourceError(f"{self.name}: compute API: {_one_line(exc)}") from None
        version = getattr(data, "max_microversion", None)
        if not version:
            return None
        return ".".join(str(p) for p in version) if isinstance(version, tuple) else str(version)


# --------------------------------------------------------------------------- reading
def read_openstack(api: Any) -> CloudState:
    """Everything the importer reads of one cloud, as a :class:`CloudState`.

    ``api`` has ``compute(path, microversion)``, ``image(path)``, ``placement(path)``,
    ``compute_max_version()`` and ``name`` (:class:`OpenStackAPI`, or a test double).
    """
    state = CloudState(source=api.name)
    newest = api.compute_max_version()

    def version(what: str) -> str | None:
        return _cap(MICROVERSIONS[what], newest)

    def compute(what: str, path: str, key: str) -> list[dict[str, Any]]:
        return _pages(lambda p: api.compute(p, version(what)), path, key)

    hypervisors = compute("hypervisors", "/os-hypervisors/detail", "hypervisors")
    legacy: dict[str, dict[str, Any]] = {}
    if version("hypervisors") != version("legacy_hypervisors"):
        for hyp in _pages(lambda p: api.compute(p, version("legacy_hypervisors")),
                          "/os-hypervisors/detail", "hypervisors"):
            legacy[str(hyp.get("id"))] = hyp
    services = compute("services", "/os-services?binary=nova-compute", "services")
    aggregates = api.compute("/os-aggregates", version("aggregates")).get("aggregates") or []
    flavors = compute("flavors", "/flavors/detail?is_public=None", "flavors")
    groups = _offset_pages(lambda p: api.compute(p, version("server_groups")),
                           "/os-server-groups?all_projects=True", "server_groups")
    servers = compute("servers", "/servers/detail?all_tenants=1", "servers")
    images = _glance_pages(api.image, "/images")
    for kind, items in (("hypervisor", hypervisors), ("service", services),
                        ("aggregate", aggregates), ("flavor", flavors),
                        ("server group", groups), ("server", servers)):
        _unknown_fields(state, kind, items)

    state.providers = placement.read_providers(api.placement, state)
    service_of = {s.get("host"): s for s in services
                  if s.get("binary", "nova-compute") == "nova-compute"}
    state.nodes = _each(state, "hypervisor", hypervisors,
                        lambda h: _node(state, h, legacy.get(str(h.get("id")), {}), service_of))
    state.aggregates = _each(state, "aggregate", aggregates, lambda a: _aggregate(state, a))
    state.flavors = _each(state, "flavor", flavors,
                          lambda f: _flavor(state, api, f, version("flavors")))
    image_names = _image_names(state, images)
    state.images = _each(state, "image", [i for i in images if i["id"] in image_names],
                         lambda i: _image(i, image_names[i["id"]]))
    taken: set[str] = set()
    state.server_groups = _each(state, "server group", groups, lambda g: _group(state, g, taken))
    flavor_names = {str(f.get("id")): f.get("name") for f in flavors}
    state.servers = _each(state, "server", servers,
                          lambda s: _server(state, s, flavor_names, image_names))
    return state


def _each(state: CloudState, kind: str, items: list[dict[str, Any]],
          convert: Callable[[dict[str, Any]], Any]) -> list[Any]:
    """Every item converted; one whose shape is off (a list where an object belongs, a
    number where text does) is left out with a warning naming it, never a traceback."""
    out = []
    for item in items:
        try:
            converted = convert(item)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            state.warn(f"{kind} {_label(kind, item)}: unreadable ({_one_line(exc)}); left out")
            continue
        if converted is not None:
            out.append(converted)
    return out


def _cap(wanted: str, newest: str | None) -> str | None:
    if newest is None:
        return None
    return wanted if _tuple(wanted) <= _tuple(newest) else newest


def _tuple(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor or 0)


def _with_query(path: str, extra: dict[str, str]) -> str:
    base, _, query = path.partition("?")
    params = dict(parse_qsl(query, keep_blank_values=True))
    params.update(extra)
    return f"{base}?{urlencode(params)}"


def _pages(get: Callable[[str], Any], path: str, key: str) -> list[dict[str, Any]]:
    """Every item of a Nova list, following its ``<key>_links`` next link (only its
    query is taken: the link's host may be one the importer cannot reach)."""
    items: list[dict[str, Any]] = []
    url: str | None = _with_query(path, {"limit": str(PAGE)})
    seen: set[str] = set()
    while url is not None and url not in seen:
        seen.add(url)
        body = get(url)
        page = body.get(key) if isinstance(body, dict) else None
        if not isinstance(page, list):
            raise CloudSourceError(f"GET {path}: the answer holds no list {key!r}")
        items.extend(i for i in page if isinstance(i, dict))
        url = None
        for link in body.get(f"{key}_links") or []:
            if isinstance(link, dict) and link.get("rel") == "next" and link.get("href"):
                query = dict(parse_qsl(urlsplit(str(link["href"])).query, keep_blank_values=True))
                url = _with_query(path, query)
    return items


def _offset_pages(get: Callable[[str], Any], path: str, key: str) -> list[dict[str, Any]]:
    """Every item of a Nova list paged by ``limit``/``offset`` (server groups)."""
    items: list[dict[str, Any]] = []
    while True:
        page = get(_with_query(path, {"limit": str(PAGE), "offset": str(len(items))})).get(key)
        if not isinstance(page, list):
            raise CloudSourceError(f"GET {path}: the answer holds no list {key!r}")
        items.extend(i for i in page if isinstance(i, dict))
        if len(page) < PAGE:
            return items


def _glance_pages(get: Callable[[str], Any], path: str) -> list[dict[str, Any]]:
    """Every image, following Glance's ``next`` (its query, as for Nova's links)."""
    items: list[dict[str, Any]] = []
    url: str | None = _with_query(path, {"limit": str(PAGE)})
    seen: set[str] = set()
    while url is not None and url not in seen:
        seen.add(url)
        body = get(url)
        page = body.get("images") if isinstance(body, dict) else None
        if not isinstance(page, list):
            raise CloudSourceError(f"image API GET {path}: the answer holds no list 'images'")
        items.extend(i for i in page if isinstance(i, dict) and isinstance(i.get("id"), str))
        nxt = body.get("next")
        url = _with_query(path, dict(parse_qsl(urlsplit(nxt).query))) if nxt else None
    return items


def _label(kind: str, item: dict[str, Any]) -> str:
    name = item.get("hypervisor_hostname") or item.get("name") or item.get("host")
    ident = item.get("id")
    return f"{name} ({ident})" if name and ident is not None and name != ident else str(name or ident)


def _unknown_fields(state: CloudState, kind: str, items: list[dict[str, Any]]) -> None:
    """One warning per unknown field, naming the objects that carry it."""
    holders: dict[str, list[str]] = {}
    for item in items:
        for key in sorted(set(item) - KNOWN_FIELDS[kind]):
            holders.setdefault(key, []).append(_label(kind, item))
    for key, labels in sorted(holders.items()):
        state.warn(f"{kind}s {names_list(labels)}: unknown field {key!r}; ignored")


def _named(state: CloudState, kind: str, item: dict[str, Any]) -> bool:
    if isinstance(item.get("name"), str) and item["name"]:
        return True
    state.warn(f"{kind} {_label(kind, item)}: no name; left out")
    return False


# --------------------------------------------------------------------------- compute nodes
def _node(state: CloudState, hyp: dict[str, Any], legacy: dict[str, Any],
          service_of: dict[Any, dict[str, Any]]) -> ComputeNode | None:
    """A hypervisor (and its legacy fields) as a compute node, with its service."""
    label = _label("hypervisor", hyp)
    host = (hyp.get("service") or {}).get("host") if isinstance(hyp.get("service"), dict) else None
    nodename = hyp.get("hypervisor_hostname")
    if not isinstance(host, str) or not host:
        state.warn(f"hypervisor {label}: no service host; left out")
        return None
    if not isinstance(nodename, str) or not nodename:
        state.warn(f"hypervisor {label}: no hypervisor_hostname; left out")
        return None
    old = {**hyp, **legacy}
    node = ComputeNode(host=host, nodename=nodename,
                       uuid=str(hyp["id"]) if _is_uuid(hyp.get("id")) else None)
    node.fields["hypervisor_type"] = hyp.get("hypervisor_type")
    node.fields["hypervisor_version"] = _int_field(state, label, hyp, "hypervisor_version")
    node.fields["host_ip"] = hyp.get("host_ip")
    cpu_info = old.get("cpu_info")
    if isinstance(cpu_info, str):
        try:
            cpu_info = json.loads(cpu_info)
        except ValueError:
            state.warn(f"hypervisor {label}: cpu_info is not JSON; left out")
            cpu_info = None
    if isinstance(cpu_info, dict) and cpu_info:
        node.fields["cpu_info"] = cpu_info
        node.fields["supported_instances"] = _supported_instances(
            hyp.get("hypervisor_type"), cpu_info)
    node.fields["disk_available_least"] = _int_field(state, label, old, "disk_available_least",
                                                     minimum=None)
    workload = _int_field(state, label, old, "current_workload")
    if workload:
        node.fields["io_workload"] = workload
    for key in ("vcpus", "vcpus_used", "memory_mb", "memory_mb_used", "local_gb",
                "local_gb_used"):
        value = _int_field(state, label, old, key)
        if value is not None:
            node.capacity[key] = value
    service = service_of.get(host)
    if service is None:
        state.warn(f"hypervisor {label}: host {host} has no nova-compute service; "
                   "written as down (Nova never schedules to it)")
        node.service = {"up": False}
    else:
        disabled = service.get("status") == "disabled"
        node.service = {"disabled": disabled,
                        "disabled_reason": service.get("disabled_reason") if disabled else None,
                        "forced_down": bool(service.get("forced_down")),
                        # Forced down is down already; "up: false" says "silent".
                        "up": service.get("state", "up") == "up"
                        or bool(service.get("forced_down"))}
    return node


def _supported_instances(hypervisor_type: Any, cpu_info: dict[str, Any]) -> list[list[str]] | None:
    """What a libvirt compute reports as ``supported_instances``, which Nova's API does not
    show: its CPU architecture under both domain types libvirt's QEMU offers (``kvm``
    and ``qemu``), as HVM guests. Without it ImagePropertiesFilter would reject every
    image that names an architecture or hypervisor type. None for other drivers."""
    arch = cpu_info.get("arch")
    if not isinstance(arch, str) or str(hypervisor_type).upper() not in ("QEMU", "KVM"):
        return None
    return [[arch, "kvm", "hvm"], [arch, "qemu", "hvm"]]


def _int_field(state: CloudState, label: str, item: dict[str, Any], key: str,
               minimum: int | None = 0) -> int | None:
    value = item.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        state.warn(f"hypervisor {label}: {key} {value!r} is not an integer"
                   + (f" >= {minimum}" if minimum is not None else "") + "; left out")
        return None
    return value


def _is_uuid(value: Any) -> bool:
    import uuid

    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return isinstance(value, str)


# --------------------------------------------------------------------------- the rest
def _aggregate(state: CloudState, data: dict[str, Any]) -> dict[str, Any] | None:
    if not _named(state, "aggregate", data):
        return None
    metadata = {str(k): v for k, v in (data.get("metadata") or {}).items()}
    zone = metadata.pop("availability_zone", None) or data.get("availability_zone")
    entry: dict[str, Any] = {"name": data["name"]}
    if isinstance(data.get("id"), int):
        entry["id"] = data["id"]
    if data.get("uuid"):
        entry["uuid"] = data["uuid"]
    if zone:
        entry["availability_zone"] = zone
    entry["metadata"] = metadata
    entry["hosts"] = [h for h in data.get("hosts") or [] if isinstance(h, str)]
    return entry


def _flavor(state: CloudState, api: Any, data: dict[str, Any],
            version: str | None) -> dict[str, Any] | None:
    if not _named(state, "flavor", data):
        return None
    specs = data.get("extra_specs")
    if specs is None:
        specs = api.compute(f"/flavors/{data.get('id')}/os-extra_specs", version).get(
            "extra_specs") or {}
    swap = data.get("swap")
    entry = {"name": data["name"], "flavorid": str(data.get("id")),
             "vcpus": data.get("vcpus"), "memory_mb": data.get("ram"),
             "root_gb": data.get("disk"),
             "ephemeral_gb": data.get("OS-FLV-EXT-DATA:ephemeral") or 0,
             "swap": swap if isinstance(swap, int) else 0}  # "" before 2.75 means none
    if specs:
        entry["extra_specs"] = dict(specs)
    return entry


def _image_names(state: CloudState, images: list[dict[str, Any]]) -> dict[str, str]:
    """Image id -> a unique name in the file (the id for a nameless image)."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for image in images:
        name = image.get("name") or image["id"]
        if name in taken:
            unique = f"{name}-{image['id'][:8]}"
            state.warn(f"image {image['id']}: a second image named {name!r}; written as {unique!r}")
            name = unique
        taken.add(name)
        names[image["id"]] = name
    return names


def _image(data: dict[str, Any], name: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "id": data["id"]}
    if data.get("disk_format"):
        entry["disk_format"] = data["disk_format"]
    properties = {k: v for k, v in data.items() if k not in GLANCE_FIELDS and v is not None}
    if properties:
        entry["properties"] = properties
    return entry


def _group(state: CloudState, data: dict[str, Any], taken: set[str]) -> dict[str, Any] | None:
    """A server group; ``taken`` holds the names given so far (Nova's need not differ)."""
    if not _named(state, "server group", data):
        return None
    policy = data.get("policy")
    if policy is None and isinstance(data.get("policies"), list) and data["policies"]:
        policy = data["policies"][0]  # before 2.64: one policy in a list
    name = data["name"]
    if name in taken:
        unique = f"{name}-{str(data.get('id'))[:8]}"
        state.warn(f"server group {data.get('id')}: a second group named {name!r}; "
                   f"written as {unique!r}")
        name = unique
    taken.add(name)
    entry: dict[str, Any] = {"name": name, "uuid": data.get("id"), "policy": policy}
    if data.get("rules"):
        entry["rules"] = dict(data["rules"])
    entry["members"] = [m for m in data.get("members") or [] if isinstance(m, str)]
    if data.get("project_id"):
        entry["project_id"] = data["project_id"]
    return entry


def _server(state: CloudState, data: dict[str, Any], flavor_names: dict[str, Any],
            image_names: dict[str, str]) -> Server | None:
    if not isinstance(data.get("id"), str):
        state.warn(f"server {_label('server', data)}: no id; left out")
        return None
    flavor = data.get("flavor")
    flavor_name = None
    if isinstance(flavor, dict):
        # 2.47+: the instance's own copy of its flavor, by the name it had.
        flavor_name = flavor.get("original_name") or flavor_names.get(str(flavor.get("id")))
    image = data.get("image")
    image_name = None
    if isinstance(image, dict) and image.get("id"):
        image_name = image_names.get(str(image["id"]))
        if image_name is None:
            state.warn(f"server {data['id']}: image {image['id']} is not among the images "
                       "read (deleted, or not visible); written without one")
    return Server(uuid=data["id"], host=data.get("OS-EXT-SRV-ATTR:host"),
                  nodename=data.get("OS-EXT-SRV-ATTR:hypervisor_hostname"),
                  flavor=flavor_name, image=image_name, project_id=data.get("tenant_id"))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__

