"""HTTP answers of the stand-in (aiohttp is imported only when one is made, so the command
line starts quickly without it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web


def json_response(data: Any, status: int = 200) -> web.Response:
    import orjson
    from aiohttp import web

    return web.Response(body=orjson.dumps(data), status=status,
                        content_type="application/json")


def text_response(text: str) -> web.Response:
    from aiohttp import web

    return web.Response(text=text)


def unauthorized() -> web.Response:
    return json_response({"error": "Unauthorized"}, status=401)
