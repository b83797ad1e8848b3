"""Reading a cloud file: the document parsed from YAML or JSON with errors naming the
file and line (:func:`read_document`), and typed reads of its fields with errors naming
the field path (:class:`FieldReader`: ``hosts[3].vcpus: expected an integer >= 0``).
:mod:`berth.cloudfile` builds the cloud from them."""

from __future__ import annotations

import json
import math
import os
import uuid as uuidlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import yaml

from berth import json_text
from berth.config import not_utf8
from berth.errors import CloudFileError
from berth.json_text import INT64_MAX

#: The longest text a field takes: Nova's ``String(255)`` columns (host, nodename,
#: aggregate, zone, flavor, cell and server group names, project ids, reasons).
MAX_TEXT = 255


class FieldReader:
    """Typed reads from a mapping, with errors that name the field path."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise CloudFileError(f"{path}: expected a mapping, got {show(data)}")
        self.data = data
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def unknown(self, allowed: set[str]) -> None:
        extra = sorted(str(k) for k in self.data if k not in allowed)
        if extra:
            raise CloudFileError(
                f"{self.path or 'top level'}: unknown field(s) {', '.join(extra)}; "
                f"expected some of {', '.join(sorted(allowed))}"
            )

    def text(self, key: str, default: str | None = None, required: bool = False,
             max_length: int = MAX_TEXT) -> str | None:
        """``key``'s text, at most ``max_length`` characters (Nova's columns for names,
        hosts, zones and ids hold 255)."""
        if not self.has(key):
            if required:
                raise CloudFileError(f"{self.at(key)}: required field is missing")
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise CloudFileError(f"{self.at(key)}: expected a string, got {show(value)}")
        text = str(value)
        if len(text) > max_length:
            raise CloudFileError(f"{self.at(key)}: at most {max_length} characters, got "
                                 f"{len(text)} ({show(text)})")
        return text

    def uuid(self, key: str, required: bool = False) -> str | None:
        """``key``'s text, which must be a UUID (placement's consumers and providers)."""
        value = self.text(key, required=required)
        if value is None:
            return None
        try:
            return str(uuidlib.UUID(value))  # as placement writes it: lower case, dashes
        except ValueError:
            raise CloudFileError(f"{self.at(key)}: expected a UUID, got {show(value)}") from None

    def integer(self, key: str, default: int | None = None, minimum: int | None = 0,
            required: bool = False, maximum: int = INT64_MAX) -> int | None:
        """``key``'s integer (at most 64 bits: every store and report takes those; Nova's
        own sizes, ``MAX_INT``, where the caller says so)."""
        if not self.has(key):
            if required:
                raise CloudFileError(f"{self.at(key)}: required field is missing")
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            else:
                raise CloudFileError(f"{self.at(key)}: expected an integer, got {show(value)}")
        if minimum is not None and value < minimum:
            raise CloudFileError(f"{self.at(key)}: expected an integer >= {minimum}, got {value}")
        if value > maximum:
            raise CloudFileError(f"{self.at(key)}: expected an integer up to {maximum}, got "
                                 f"{show(value)}")
        return value

    def number(self, key: str, default: float | None = None, minimum: float | None = 0.0) -> float | None:
        if not self.has(key):
            return default
        value = self.data[key]
        try:
            if isinstance(value, bool):
                raise ValueError
            result = float(value)
        except (TypeError, ValueError):
            raise CloudFileError(f"{self.at(key)}: expected a number, got {show(value)}") from None
        if math.isnan(result) or (minimum is not None and result < minimum):
            raise CloudFileError(f"{self.at(key)}: expected a number >= {minimum}, got {show(value)}")
        return result

    def flag(self, key: str, default: bool = False) -> bool:
        if not self.has(key):
            return default
        value = self.data[key]
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0"):
            return value.lower() in ("true", "yes", "1")
        raise CloudFileError(f"{self.at(key)}: expected true or false, got {show(value)}")

    def seq(self, key: str) -> list[Any]:
        if not self.has(key):
            return []
        value = self.data[key]
        if not isinstance(value, list):
            raise CloudFileError(f"{self.at(key)}: expected a list, got {show(value)}")
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        if not self.has(key):
            return {}
        value = self.data[key]
        if not isinstance(value, Mapping):
            raise CloudFileError(f"{self.at(key)}: expected a mapping, got {show(value)}")
        return dict(value)

    def str_map(self, key: str) -> dict[str, str]:
        result: dict[str, str] = {}
        for k, v in self.mapping(key).items():
            if isinstance(v, (dict, list)) or v is None:
                raise CloudFileError(f"{self.at(key)}.{k}: expected a string value, got {show(v)}")
            result[str(k)] = as_text(v)
        return result


def as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def timestamp(value: Any, path: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        return moment.timestamp()
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise CloudFileError(f"{path}: expected an ISO 8601 time or epoch seconds, got {show(value)}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    raise CloudFileError(f"{path}: expected an ISO 8601 time or epoch seconds, got {show(value)}")


def read_document(path: str) -> Any:
    """Parse a YAML or JSON file (JSON is YAML) with errors that name the file and line."""
    if os.path.isdir(path):
        raise CloudFileError(f"{path}: a directory, not a cloud file")
    if not os.path.exists(path):
        raise CloudFileError(f"{path}: no such file")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError as exc:
        raise CloudFileError(f"{path}: {not_utf8(exc)}") from None
    except OSError as exc:
        raise CloudFileError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if not text.strip():
        raise CloudFileError(f"{path}: empty; a cloud file is a mapping with at least 'hosts'")
    try:
        if path.endswith(".json"):
            document = json.loads(text)
            # JSON takes "\ud800" escapes, which no name or store can hold (YAML refuses).
            bad = json_text.problem(text.encode("utf-8", "surrogatepass"), document,
                                    big_ints=False)
            if bad is not None:
                raise CloudFileError(f"{path}: {bad}")
            return document
        # libyaml's parser when PyYAML has it: the same documents, about 4x faster on
        # an imported cloud of thousands of hosts.
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except RecursionError:
        raise CloudFileError(f"{path}: nested too deeply to be a cloud file") from None
    except json.JSONDecodeError as exc:
        raise CloudFileError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise CloudFileError(f"{path}: invalid YAML{where}: {getattr(exc, 'problem', exc)}") from exc
