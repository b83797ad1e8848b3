"""Resolve filter and weigher names from configuration, failing at start-up.

Sources, in order: the built-in registries (``berth.filters.all_filters`` /
``berth.weighers.all_weighers``, with Nova's paths as aliases), dotted paths to classes
or to functions returning lists of classes, and the ``berth.filters`` / ``berth.weighers``
entry-point groups of installed packages. An unknown name raises
:class:`~berth.errors.PluginNotFound` listing the known ones.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Iterable
from importlib import metadata
from typing import Any, TypeVar

from berth.config import SchedulerConfig
from berth.errors import PluginNotFound
from berth.filters.base import BaseHostFilter
from berth.filters.registry import BUILTIN_FILTERS
from berth.filters.registry import load_builtin as load_builtin_filter
from berth.weighers.base import BaseHostWeigher
from berth.weighers.registry import BUILTIN_WEIGHERS
from berth.weighers.registry import load_builtin as load_builtin_weigher

LOG = logging.getLogger(__name__)

P = TypeVar("P")

ALL_FILTERS_NAMES = {"berth.filters.all_filters", "nova.scheduler.filters.all_filters"}
DEPRECATED_FILTER_LISTS = {"nova.scheduler.filters.standard_filters"}
ALL_WEIGHERS_NAMES = {"berth.weighers.all_weighers", "nova.scheduler.weights.all_weighers"}
NOVA_FILTER_PREFIX = "nova.scheduler.filters."
#: Names older documents use for a built-in filter (seed 002 says ComputeCapabilityFilter).
DEPRECATED_FILTER_NAMES = {
    "ComputeCapabilityFilter": "ComputeCapabilitiesFilter",
    "ComputeCapabilitesFilter": "ComputeCapabilitiesFilter",
}
NOVA_WEIGHER_PREFIX = "nova.scheduler.weights."
#: Names older documents use for a built-in weigher (seed 003 says RamWeigher).
DEPRECATED_WEIGHER_NAMES = {"RamWeigher": "RAMWeigher"}


def _import_path(path: str, option: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise PluginNotFound(f"{option}: {path!r} is not a dotted path (module.Class)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginNotFound(f"{option}: cannot import module {module_name!r} for {path!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise PluginNotFound(f"{option}: module {module_name!r} has no {attr!r}") from None


def _expand(obj: Any, base: type[P], path: str, option: str) -> list[type[P]]:
    if isinstance(obj, type):
        if not issubclass(obj, base):
            raise PluginNotFound(f"{option}: {path} is not a subclass of {base.__name__}")
        return [obj]
    if inspect.isfunction(obj):
        # A list function (Nova's all_filters shape) takes no arguments. Only functions
        # written in Python are called: a builtin such as os.system is never a list of
        # plugins, and calling one from a configuration file must not be possible.
        try:
            classes = list(obj())
        except Exception as exc:  # noqa: BLE001 - any failure of the function is one line
            raise PluginNotFound(
                f"{option}: {path}() did not return a list of classes: "
                f"{type(exc).__name__}: {exc}") from None
        for cls in classes:
            if not (isinstance(cls, type) and issubclass(cls, base)):
                raise PluginNotFound(f"{option}: {path}() returned {cls!r}, not a {base.__name__}")
        return classes
    raise PluginNotFound(f"{option}: {path} is neither a class nor a function returning classes")


def entry_point_classes(group: str, base: type[P]) -> dict[str, type[P]]:
    """Classes registered by installed packages under an entry-point group.

    Each is known by its entry-point name and by its class name.
    """
    found: dict[str, type[P]] = {}
    for ep in metadata.entry_points(group=group):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken third-party package must name itself
            raise PluginNotFound(f"entry point {ep.name!r} in group {group!r} failed to load: {exc}") from exc
        for cls in _expand(obj, base, f"{ep.value}", f"entry point {group}:{ep.name}"):
            found[cls.__name__] = cls
            found.setdefault(ep.name, cls)
    return found


def available_filter_classes(config: SchedulerConfig) -> dict[str, type[BaseHostFilter]]:
    """Every filter class ``enabled_filters`` may name, by class name."""
    available: dict[str, type[BaseHostFilter]] = {}
    option = "[filter_scheduler] available_filters"
    for path in config.filter_scheduler.available_filters:
        if path in ALL_FILTERS_NAMES or path in DEPRECATED_FILTER_LISTS:
            if path in DEPRECATED_FILTER_LISTS:
                LOG.warning("%s: %s is deprecated; use berth.filters.all_filters", option, path)
            for name in BUILTIN_FILTERS:
                available[name] = load_builtin_filter(name)
        elif path.startswith(NOVA_FILTER_PREFIX) and path.rsplit(".", 1)[-1] in BUILTIN_FILTERS:
            name = path.rsplit(".", 1)[-1]
            available[name] = load_builtin_filter(name)
        else:
            for cls in _expand(_import_path(path, option), BaseHostFilter, path, option):
                available[cls.__name__] = cls
    for name, cls in entry_point_classes("berth.filters", BaseHostFilter).items():
        available.setdefault(name, cls)
    return available


def _instantiate(cls: type[P], config: SchedulerConfig) -> P:
    try:
        obj = cls(config=config)  # type: ignore[call-arg]
    except TypeError:
        # A plugin written for Nova may define __init__(self) without arguments.
        obj = cls()
    obj.config = config  # type: ignore[attr-defined]
    return obj


def load_filters(config: SchedulerConfig) -> list[BaseHostFilter]:
    """Instantiate the enabled filters, in configured order (once, at start-up)."""
    available = available_filter_classes(config)
    filters: list[BaseHostFilter] = []
    for name in config.filter_scheduler.enabled_filters:
        if name not in available and name in DEPRECATED_FILTER_NAMES:
            LOG.warning("[filter_scheduler] enabled_filters: %s is an old name of %s",
                        name, DEPRECATED_FILTER_NAMES[name])
            name = DEPRECATED_FILTER_NAMES[name]
        cls = available.get(name)
        if cls is None:
            raise PluginNotFound(
                f"[filter_scheduler] enabled_filters: filter {name!r} is not available; "
                f"known filters: {', '.join(sorted(available))}"
            )
        filters.append(_instantiate(cls, config))
    return filters


def weigher_classes(config: SchedulerConfig) -> list[type[BaseHostWeigher]]:
    """The weigher classes ``weight_classes`` names, in order. A class named twice
    weighs twice, as in Nova (its loader keeps every entry, and its host manager makes a
    weigher of each)."""
    option = "[filter_scheduler] weight_classes"
    plugins = entry_point_classes("berth.weighers", BaseHostWeigher)
    classes: list[type[BaseHostWeigher]] = []
    for path in config.filter_scheduler.weight_classes:
        short = path.rsplit(".", 1)[-1]
        if short in DEPRECATED_WEIGHER_NAMES and (path == short or path.startswith(NOVA_WEIGHER_PREFIX)) \
                and short not in plugins:
            LOG.warning("%s: %s is an old name of %s", option, short, DEPRECATED_WEIGHER_NAMES[short])
            path = short = DEPRECATED_WEIGHER_NAMES[short]
        if path in ALL_WEIGHERS_NAMES:
            found = [load_builtin_weigher(name) for name in BUILTIN_WEIGHERS]
        elif path in BUILTIN_WEIGHERS or (path.startswith(NOVA_WEIGHER_PREFIX) and short in BUILTIN_WEIGHERS):
            found = [load_builtin_weigher(short)]
        elif path in plugins:
            found = [plugins[path]]
        elif "." in path:
            found = _expand(_import_path(path, option), BaseHostWeigher, path, option)
        else:
            known = sorted(set(BUILTIN_WEIGHERS) | set(plugins) | ALL_WEIGHERS_NAMES)
            raise PluginNotFound(f"{option}: weigher {path!r} is not known; known weighers: {', '.join(known)}")
        classes.extend(found)
    return classes


def load_weighers(config: SchedulerConfig) -> list[BaseHostWeigher]:
    """Instantiate the configured weighers, in order (once, at start-up)."""
    classes = weigher_classes(config)
    for cls in classes:
        if not cls.implements_weighing():
            raise PluginNotFound(
                f"[filter_scheduler] weight_classes: weigher {cls.__name__} implements "
                "neither _weigh_object nor weigh_objects")
    return [_instantiate(cls, config) for cls in classes]


def names(objs: Iterable[Any]) -> list[str]:
    """Class names of plugin objects."""
    return [type(o).__name__ for o in objs]
