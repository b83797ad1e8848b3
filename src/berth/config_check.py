"""Which options of a nova.conf Berth reads, which are Nova's own, and which are typos.

Every command that reads nova.conf warns about what is likely a mistake, and ``berth
config check`` lists the rest:

* an option of one of Berth's groups, or a deprecated name of one, is Berth's;
* an option of the sections Berth's services read through their libraries
  (``[keystone_authtoken]`` by keystonemiddleware, ``[oslo_policy]`` by oslo.policy,
  ``[placement]`` by keystoneauth, ``[oslo_messaging_*]`` by oslo.messaging, ``[api]
  auth_strategy``) is Berth's too;
* any other option Nova 34 knows (``[DEFAULT] debug``, ``log_file``, ``[libvirt] ...``)
  is "not used by Berth": no warning;
* anything else is a warning naming the file, section and key, with the closest known
  name when there is one ("did you mean ...?"), as is a section neither knows.

Nova's option names come from ``nova_options.json``, written by
``scripts/nova-option-names.py`` in an environment where Nova is installed (Berth never
imports Nova).
"""

from __future__ import annotations

import configparser
import difflib
import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources

from berth.config import OPTION_GROUPS, is_flag_file

#: Options Berth's services read beyond its scheduling groups.
SERVICE_OPTIONS = {"api": {"auth_strategy", "noauth2_trust_client_roles"},
                   "DEFAULT": {"transport_url", "control_exchange", "rpc_response_timeout"}}
#: Sections Berth's services hand whole to a library (Nova's table knows their keys).
LIBRARY_SECTIONS = ("keystone_authtoken", "oslo_policy", "placement", "oslo_messaging_rabbit",
                    "oslo_messaging_notifications", "oslo_messaging_kafka")


@dataclass
class OptionReport:
    """What the files set: ``problems`` are warnings; ``not_used`` Nova's options that
    Berth ignores (``[section] key``)."""

    problems: list[str] = field(default_factory=list)
    not_used: list[str] = field(default_factory=list)


@functools.cache
def nova_sections() -> dict[str, frozenset[str]]:
    """Nova's option names by section (deprecated names included)."""
    raw = json.loads(resources.files("berth").joinpath("nova_options.json").read_text())
    return {section: frozenset(names) for section, names in raw["sections"].items()}


@functools.cache
def nova_release() -> str:
    """The Nova release the table was written from."""
    raw = json.loads(resources.files("berth").joinpath("nova_options.json").read_text())
    return str(raw["nova"])


def _berth_sections() -> dict[str, set[str]]:
    known: dict[str, set[str]] = {}
    for group, opts in OPTION_GROUPS.items():
        names = known.setdefault(group, set())
        for opt in opts:
            names.add(opt.dest)
            for dep in opt.deprecated_opts:
                if dep.name:  # a deprecated name may sit in another section ([DEFAULT])
                    known.setdefault(dep.group or group, set()).add(dep.name)
    for section, names in SERVICE_OPTIONS.items():
        known.setdefault(section, set()).update(names)
    nova = nova_sections()
    for section in LIBRARY_SECTIONS:
        known.setdefault(section, set()).update(nova.get(section, ()))
    return known


@functools.lru_cache(maxsize=32)
def _auth_plugin_options(auth_type: str) -> frozenset[str]:
    """The option names of keystoneauth's plugin ``auth_type`` (none when unknown)."""
    from keystoneauth1 import exceptions, loading

    try:
        options = loading.get_plugin_options(auth_type.strip())
    except (exceptions.NoMatchingPlugin, ValueError):
        return frozenset()
    names = set()
    for opt in options:
        names.add(opt.dest)
        names.update(d.name.replace("-", "_") for d in getattr(opt, "deprecated", []) or [])
    return frozenset(names)


def check_files(paths: Iterable[str]) -> OptionReport:
    """Classify every option the INI files set (flag files hold only Berth's)."""
    report = OptionReport()
    berth, nova = _berth_sections(), nova_sections()
    for path in paths:
        if is_flag_file(path):
            continue
        parser = configparser.RawConfigParser(strict=False)
        with open(path, encoding="utf-8") as handle:
            parser.read_file(handle)
        sections = [("DEFAULT", list(parser.defaults()))] + [
            (s, [k for k, _ in parser.items(s, raw=True) if k not in parser.defaults()])
            for s in parser.sections()
        ]
        for section, keys in sections:
            ours, theirs = berth.get(section), nova.get(section)
            if "auth_type" in keys and (ours is not None or theirs is not None):
                # A keystoneauth section: the options of the plugin it names are real.
                plugin = _auth_plugin_options(parser.get(section, "auth_type", raw=True))
                ours = (ours or set()) | plugin
            if ours is None and theirs is None:
                close = difflib.get_close_matches(section, [*berth, *nova], n=1, cutoff=0.8)
                hint = f"; did you mean [{close[0]}]?" if close else ""
                report.problems.append(f"{path}: [{section}] is not a known section{hint} "
                                       "(its options are ignored)")
                continue
            for key in keys:
                if key in (ours or ()) or (section == "DEFAULT" and key.endswith("_weight")):
                    continue
                if key in (theirs or ()):
                    report.not_used.append(f"[{section}] {key}")
                    continue
                names = sorted((ours or set()) | (theirs or set()))
                close = difflib.get_close_matches(key, names, n=1, cutoff=0.8)
                hint = f"; did you mean {close[0]}?" if close else ""
                report.problems.append(f"{path}: [{section}] {key} is not a known option{hint}")
    return report
