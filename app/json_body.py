"""Strict JSON request bodies, and text that is safe to write to a log line.

Python's `json` accepts `NaN`, `Infinity`, numbers that overflow to infinity (`1e999`) and
strings with unpaired surrogates (`"\\ud800"`); none of them is JSON a client should send, and
none can be encoded again: echoed in a 422, stored or logged, each used to end in a 500. Routes
of a router made with `route_class=StrictJSONRoute` parse bodies with `loads`, which refuses
them (and NUL, which PostgreSQL cannot store in text) as a JSON decode error: 422.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute


def _refuse(message: str, doc: str = "") -> json.JSONDecodeError:
    return json.JSONDecodeError(message, doc, 0)


def _no_constant(name: str) -> Any:
    raise _refuse(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _refuse(f"{text[:20]} is out of range")
    return value


def _check_text(value: str) -> None:
    if "\x00" in value:
        raise _refuse("strings may not contain NUL (\\u0000)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _refuse("strings may not contain unpaired surrogates") from None


def loads(body: bytes | str) -> Any:
    """`json.loads`, refusing non-finite numbers, unpaired surrogates and NUL (JSONDecodeError)."""
    value = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    stack = [value]
    while stack:  # iterative: a deeply nested body must not exhaust the recursion limit here
        item = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key)
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)
    return value


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """An APIRoute whose JSON body is parsed by `loads`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict


def printable(text: str) -> str:
    """`text` with control and other invisible characters (ESC, VT, NEL, U+2028, ...) escaped,
    so a request path cannot forge or recolour log lines."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
