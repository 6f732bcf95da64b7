"""A cap on request bodies: a 30 MB JSON to an unauthenticated endpoint is refused, not read.

Pure ASGI, so it counts the bytes as they arrive: a declared `Content-Length` over the cap is
refused before reading, and a chunked body is cut off when it passes the cap. Both get 413.
"""

from __future__ import annotations

from fastapi import HTTPException
from fastapi.responses import JSONResponse


class BodyTooLarge(HTTPException):
    """An HTTPException, so FastAPI's body parsing passes it on as 413 (not its generic 400)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body over {max_bytes} bytes")


class BodyLimit:
    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            return await self._refuse(scope, receive, send)
        received = 0
        started = False

        async def counted_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope, receive, send) -> None:
        error = BodyTooLarge(self.max_bytes)
        response = JSONResponse({"detail": error.detail}, status_code=error.status_code)
        await response(scope, receive, send)
