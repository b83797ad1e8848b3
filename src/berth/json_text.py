"""What a JSON decoder lets through and nothing after it can take.

* An unpaired UTF-16 surrogate (``"\\ud800"``) is valid JSON text but not Unicode: no
  database driver, UTF-8 encoder or orjson call downstream accepts the string.
* An integer beyond 64 bits decodes to a Python int, which orjson (the host reports,
  the stored records) refuses to encode.

The request readers call :func:`problem` after decoding a body. Only a body whose text
could hold either (a ``\\uD8..``-``\\uDF..`` escape, a run of 19 digits) is walked, so
the common body costs two regular-expression scans.
"""

from __future__ import annotations

import re
from typing import Any

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONG_DIGITS = re.compile(rb"[0-9]{19}")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def problem(raw: bytes, value: Any, *, big_ints: bool = True) -> str | None:
    """The first such thing in ``value`` (decoded from ``raw``) as ``"<where>: <what>"``,
    or None. ``where`` is the field's path (``flavor.name``, ``traits[3]``; ``body``
    for the body itself); ``big_ints=False`` leaves integers to the caller's schema."""
    surrogates = _SURROGATE_ESCAPE.search(raw) is not None
    big = big_ints and _LONG_DIGITS.search(raw) is not None
    if not (surrogates or big):
        return None
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        where = path or "body"
        if isinstance(item, str):
            if surrogates and _unpaired(item):
                return f"{where}: the string holds an unpaired UTF-16 surrogate"
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int):
            if big and not INT64_MIN <= item <= INT64_MAX:
                digits = str(item)
                shown = digits if len(digits) <= 24 else f"{digits[:20]}... ({len(digits)} digits)"
                return f"{where}: {shown} is out of the 64-bit integer range"
        elif isinstance(item, dict):
            for key in reversed(list(item)):
                if surrogates and _unpaired(key):
                    return f"{where}: a key holds an unpaired UTF-16 surrogate"
                stack.append((f"{path}.{key}" if path else str(key), item[key]))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", item[i]) for i in reversed(range(len(item))))
    return None


def _unpaired(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
