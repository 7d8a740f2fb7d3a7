"""What the OpenAI routes share: JSON answers, errors in the OpenAI shape, the tenant.

Private to ``roder_server.openai``: its route modules import these names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from roder_api.errors import RoderError, ThreadNotFoundError
from roder_api.events import ItemCompleted, JournalEvent
from roder_api.threads import validate_thread_id
from roder_server._problems import from_error
from roder_server.openai._convert import OpenAIError, bad_request, item_json, not_found

Endpoint = Callable[[Request], Awaitable[Response]]


def json_response(body: Any, status: int = 200) -> Response:
    """Return ``body`` as a JSON response with ``status``."""
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _error(status: int, message: str, kind: str) -> OpenAIError:
    return OpenAIError(status, message, kind=kind)


def openai_errors(endpoint: Endpoint) -> Endpoint:
    """Answer every failure of ``endpoint`` in the OpenAI error shape."""

    async def handle(request: Request) -> Response:
        try:
            return await endpoint(request)
        except OpenAIError as exc:
            return json_response(exc.body(), exc.status)
        except ThreadNotFoundError as exc:
            return json_response(not_found(str(exc)).body(), 404)
        except (RoderError, ValueError) as exc:
            status = getattr(exc, "status", None)
            if status is None and isinstance(exc, RoderError):
                # The server's one mapping of Roder's errors (InputTooLargeError 413, a
                # StoreError 503, ...); one it does not know is the request's (400).
                status = from_error(exc).status
                status = None if status == 500 else status
            if isinstance(status, int) and 400 <= status < 600:  # the core's Problem
                kind = "invalid_request_error" if status < 500 else "server_error"
                return json_response(
                    _error(status, str(getattr(exc, "detail", exc)), kind).body(), status
                )
            return json_response(bad_request(str(exc)).body(), 400)
        except Exception as exc:  # noqa: BLE001 - the core's Problem and the rest
            status = getattr(exc, "status", None)
            if isinstance(status, int) and 400 <= status < 600:
                kind = "invalid_request_error" if status < 500 else "server_error"
                return json_response(
                    _error(status, str(getattr(exc, "detail", exc)), kind).body(), status
                )
            raise

    return handle


def tenant_of(request: Request) -> Any:
    """Return the tenant (the server's view for this request's caller)."""
    return request.app.state.server.for_request(request)


async def read_body(request: Request) -> dict[str, Any]:
    """Return the request's JSON object body (an OpenAI-shaped 400 when it is not one)."""
    raw = await request.body()
    try:
        data = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    return data


def conversation_id(value: Any) -> str:
    """Return a conversation (its id, or an object with an ``id``) as a checked thread id."""
    if isinstance(value, Mapping):
        value = value.get("id")
    try:
        return validate_thread_id(value)
    except ValueError:
        raise bad_request(
            f"'conversation' {value!r} is not a conversation id", "conversation"
        ) from None


def items_of(entries: list[JournalEvent], turn_id: str | None) -> list[dict[str, Any]]:
    """Return the items completed in ``entries`` (of one turn, if given) as OpenAI items."""
    out: list[dict[str, Any]] = []
    for entry in entries:
        event = entry.event
        if not isinstance(event, ItemCompleted):
            continue
        if turn_id is not None and event.turn_id != turn_id:
            continue
        item = item_json(event.item, f"item_{entry.sequence}")
        if item is not None:
            out.append(item)
    return out


def list_page(data: list[dict[str, Any]]) -> dict[str, Any]:
    """Return ``data`` as an OpenAI list object."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": False,
    }
