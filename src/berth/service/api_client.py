"""One JSON call to a running Berth's scheduler API, as the commands that drive one make
it (``berth simulate --url``, ``berth capacity --url``)."""

from __future__ import annotations

from typing import Any

import httpx

from berth.errors import BerthError, InputError


def call_json(http: httpx.Client, url: str, method: str, path: str, body: Any = None,
              ok: tuple[int, ...] = (200,)) -> tuple[int, Any]:
    """``(status, JSON body)`` of ``method path`` on ``http`` (a client of ``url``). An
    unreachable server or an answer outside ``ok`` is one line with the server's message:
    :class:`InputError` for a 400 (the request itself was refused), else
    :class:`BerthError`."""
    try:
        resp = http.request(method, path, json=body)
    except httpx.HTTPError as exc:
        raise BerthError(f"{url}: {method} {path}: {exc}") from None
    try:
        data = resp.json()
    except ValueError:
        data = None
    if resp.status_code not in ok:
        message = ((data or {}).get("error") or {}).get("message") if isinstance(
            data, dict) else None
        error = InputError if resp.status_code == 400 else BerthError
        raise error(f"{url}: {method} {path} answered {resp.status_code}: "
                    f"{message or resp.text[:200]}")
    return resp.status_code, data
