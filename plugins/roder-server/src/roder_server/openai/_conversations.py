"""The OpenAI routes of conversations (a conversation is a thread) and of the models."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response

from roder_api.events import ItemCompleted
from roder_api.inference import InferenceProviderContext
from roder_api.threads import ThreadStore
from roder_server.openai._convert import bad_request, message_items, model_json
from roder_server.openai._http import (
    conversation_id,
    items_of,
    json_response,
    list_page,
    read_body,
    tenant_of,
)

# --- conversations ----------------------------------------------------------------------


def _conversation_json(metadata: Any) -> dict[str, Any]:
    extra = dict(metadata.extra or {})
    return {
        "id": metadata.thread_id,
        "object": "conversation",
        "created_at": metadata.created_at_ms // 1000,
        "metadata": dict(extra.get("metadata") or {}),
    }


async def create_conversation(request: Request) -> Response:
    body = await read_body(request)
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise bad_request("'metadata' must be an object", "metadata")
    items = message_items(body["items"]) if body.get("items") is not None else []
    tenant = tenant_of(request)
    created = await tenant.runtime.create_thread(extra={"metadata": dict(metadata)})
    if items:
        with anyio.CancelScope(shield=True):  # a client that leaves gets all or nothing
            await _append_items(await tenant.store(), created.thread_id, items)
    return json_response(_conversation_json(created))


async def _append_items(store: ThreadStore, thread_id: str, items: list[Any]) -> list[Any]:
    """Append ``items`` to the thread as completed items of a turn of their own (one atomic
    batch, no model call); return their conversation items."""
    turn_id = f"{thread_id}.i{uuid.uuid4().hex[:20]}"
    entries = await store.append_events(thread_id, [ItemCompleted(turn_id, i) for i in items])
    return items_of(entries, turn_id)


async def get_conversation(request: Request) -> Response:
    thread_id = conversation_id(request.path_params["conversation_id"])
    store = await tenant_of(request).store()
    return json_response(_conversation_json(await store.get_thread(thread_id)))


async def update_conversation(request: Request) -> Response:
    thread_id = conversation_id(request.path_params["conversation_id"])
    body = await read_body(request)
    metadata = body.get("metadata")
    if not isinstance(metadata, Mapping):
        raise bad_request("'metadata' must be an object", "metadata")
    store = await tenant_of(request).store()
    extra = dict((await store.get_thread(thread_id)).extra or {})
    extra["metadata"] = dict(metadata)
    return json_response(_conversation_json(await store.update_thread(thread_id, extra=extra)))


async def delete_conversation(request: Request) -> Response:
    thread_id = conversation_id(request.path_params["conversation_id"])
    store = await tenant_of(request).store()
    await store.get_thread(thread_id)
    await store.delete_thread(thread_id)
    return json_response({"id": thread_id, "object": "conversation.deleted", "deleted": True})


async def conversation_items(request: Request) -> Response:
    thread_id = conversation_id(request.path_params["conversation_id"])
    store = await tenant_of(request).store()
    await store.get_thread(thread_id)
    items = items_of(await store.read_events(thread_id), None)
    if request.query_params.get("order") == "desc":
        items.reverse()
    return json_response(list_page(items))


async def add_conversation_items(request: Request) -> Response:
    thread_id = conversation_id(request.path_params["conversation_id"])
    items = message_items((await read_body(request)).get("items"))
    store = await tenant_of(request).store()
    await store.get_thread(thread_id)
    with anyio.CancelScope(shield=True):  # a client that leaves gets all or nothing
        added = await _append_items(store, thread_id, items)
    return json_response(list_page(added))


# --- models -----------------------------------------------------------------------------


async def list_models(request: Request) -> Response:
    runtime = tenant_of(request).runtime
    data: list[dict[str, Any]] = []
    for engine_id, engine in sorted(runtime.registry.engines.items()):
        ctx = InferenceProviderContext(settings=dict(runtime.config.engines.get(engine_id, {})))
        try:
            with anyio.fail_after(10):
                names = [m.id for m in await engine.list_models(ctx)]
        except Exception:  # noqa: BLE001 - an engine that cannot list still has its default
            names = []
        names = names or [runtime.default_model(engine)]
        data += [model_json(engine_id, name) for name in names]
    return json_response({"object": "list", "data": data})
