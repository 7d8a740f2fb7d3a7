"""The OpenAI-compatible routes: ``/v1/responses``, ``/v1/conversations``, ``/v1/models``.

A conversation is a thread; a response is a turn (``resp_<turn id>``). The turn id names
its thread (``<thread id>.r<hex>``), so any worker finds a response's thread from its id
alone. What a request asked for that the transcript does not hold is journaled with the
turn's input (:mod:`roder_server.openai._params`), so every worker rebuilds the same
Response and the same stream from the journal: nothing lives in process memory. Errors are
in the OpenAI shape (``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from roder_api.inference import ToolSpec
from roder_api.threads import ThreadStore, validate_thread_id
from roder_api.transcript import ToolResultRecord
from roder_server._sse_response import EventStream
from roder_server.openai._conversations import (
    add_conversation_items,
    conversation_items,
    create_conversation,
    delete_conversation,
    get_conversation,
    list_models,
    update_conversation,
)
from roder_server.openai._convert import (
    OpenAIError,
    bad_request,
    not_found,
    parse_input,
    split_model,
)
from roder_server.openai._fold import AppendFeed, fold_batches, fold_response
from roder_server.openai._http import (
    conversation_id,
    items_of,
    json_response,
    list_page,
    openai_errors,
    read_body,
    tenant_of,
)
from roder_server.openai._params import (
    META_KEY,
    kept_params,
    mark_deleted,
    response_params,
    turn_start,
)
from roder_server.openai._projection import (
    ResponseProjection,
    call_id_of_approval,
    turn_id_of,
)

_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "conversation",
        "previous_response_id",
        "tools",
        "stream",
        "background",
        "store",
        "metadata",
        "tool_choice",
        "parallel_tool_calls",
        "temperature",
        "top_p",
        "max_output_tokens",
        "user",
        "truncation",
        "text",
        "reasoning",
        "include",
    }
)


def _thread_of(resp_id: str) -> tuple[str, str]:
    """Return ``(thread id, turn id)`` of a response id, or raise 404."""
    turn_id = turn_id_of(resp_id)
    thread_id, dot, rest = (turn_id or "").rpartition(".")
    if not dot or not rest.startswith("r"):
        raise not_found(f"no response {resp_id!r}", "response_id")
    try:
        return validate_thread_id(thread_id), turn_id or ""
    except ValueError:
        raise not_found(f"no response {resp_id!r}", "response_id") from None


def _projection(thread_id: str, turn_id: str, params: Mapping[str, Any]) -> ResponseProjection:
    tools = [t for t in params.get("tools") or () if isinstance(t, Mapping)]
    start = params.get("journal_after")
    return ResponseProjection(
        # Every event of the turn comes after the thread's last sequence when the request
        # was remembered: the fold starts there, not at the conversation's first event.
        last_journal_sequence=start if isinstance(start, int) and start > 0 else 0,
        thread_id=thread_id,
        turn_id=turn_id,
        model=str(params.get("model", "")),
        client_tools=frozenset(str(t.get("name")) for t in tools if t.get("type") == "function"),
        instructions=params.get("instructions"),
        previous_response_id=params.get("previous_response_id"),
        tools=tools,
        background=bool(params.get("background")),
        metadata=dict(params.get("metadata") or {}),
    )


def _sse(batches: AsyncIterator[list[dict[str, Any]]], starting_after: int) -> EventStream:
    """Stream the events after ``starting_after``: each batch the fold had at hand in
    one write (the events before a first delta go out with it, not one send each)."""

    async def body() -> AsyncIterator[bytes]:
        async for batch in batches:
            chunk = b"".join(
                b"event: %s\ndata: %s\n\n" % (event["type"].encode(), orjson.dumps(event))
                for event in batch
                if event["sequence_number"] > starting_after
            )
            if chunk:
                yield chunk

    return EventStream(body())


async def _start(
    store: ThreadStore,
    thread_id: str,
    create: bool,
    params: Mapping[str, Any],
    submit: Callable[[str, str, Mapping[str, Any], bool], Awaitable[object]],
    feed: AppendFeed,
) -> tuple[str, dict[str, Any]]:
    """Submit a new response's run with its parameters (on a new thread ``thread_id`` when
    ``create``); return ``(turn id, entry)`` once its input is durable.

    The parameters are the ``metadata`` of the turn's input: journaled in the append that
    accepts it, nothing written for a run refused (a 413, a 429), nothing streamed before it
    is durable. On an existing thread (404 for an unknown conversation) ``journal_after``,
    where the response's stream folds from, is the sequence before its turn's first event,
    which ``feed`` (listening since before the submit) was handed when the input was
    journaled here.
    """
    turn_id = _new_turn_id(thread_id)
    metadata = {META_KEY: kept_params(params)}
    await submit(thread_id, turn_id, metadata, create)  # create: as its session opens
    if create:
        return turn_id, {**params, "journal_after": 0}
    first = feed.first_of(turn_id)
    if first is None:  # not handed over (an overflow): find it in the journal
        start = await turn_start(store, thread_id, turn_id)
        if start is None:
            raise RuntimeError(f"the input of {turn_id!r} is not in thread {thread_id!r}")
        first = start[0]
    return turn_id, {**params, "journal_after": first - 1}


def _new_turn_id(thread_id: str) -> str:
    return f"{thread_id}.r{uuid.uuid4().hex[:20]}"


# --- responses --------------------------------------------------------------------------


async def create_response(request: Request) -> Response:
    body = await read_body(request)
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise bad_request(f"unknown parameter {unknown[0]!r}", unknown[0])
    if body.get("store") is False:
        raise bad_request("store=false is not supported: every response is a durable turn", "store")
    tenant = tenant_of(request)
    runtime = tenant.runtime
    engines = list(runtime.registry.engines)
    default_engine = runtime.engine(None).id
    engine, model = split_model(body.get("model"), engines, default_engine)
    runtime.engine(engine)
    parsed = parse_input(body.get("input"))
    tools = body.get("tools") or []
    specs = _function_tools(tools)
    results = tuple(ToolResultRecord(o.call_id, "", o.output) for o in parsed.outputs)
    if parsed.text is None and not results and not parsed.approvals:
        raise bad_request("'input' holds no user message", "input")
    conversation, previous = body.get("conversation"), body.get("previous_response_id")
    if conversation is not None and previous is not None:
        raise bad_request("give 'conversation' or 'previous_response_id', not both", "conversation")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string", "instructions")
    store = await tenant.store()
    previous_turn = ""
    thread_id: str | None = None
    if previous is not None:
        if not isinstance(previous, str):
            raise bad_request("'previous_response_id' must be a string", "previous_response_id")
        thread_id, previous_turn = _thread_of(previous)
        await response_params(store, thread_id, previous_turn)  # 404 for an unknown response
    elif conversation is not None:
        thread_id = conversation_id(conversation)  # its existence is checked by _start
    elif parsed.approvals:
        thread_id = (await runtime.create_thread()).thread_id  # nothing to approve there
    params: dict[str, Any] = {
        "model": f"{engine}/{model}",
        "instructions": body.get("instructions"),
        "previous_response_id": previous,
        "tools": tools,
        "background": bool(body.get("background")),
        "metadata": body.get("metadata") or {},
        "created_at": int(time.time()),
    }
    for answer in parsed.approvals:
        call_id = call_id_of_approval(answer.approval_request_id)
        if call_id is None:
            raise bad_request("not an approval request id", "input")
        assert thread_id is not None
        await tenant.dispatcher.approve(thread_id, call_id, answer.approve, answer.reason)
    if parsed.text is None and not results and thread_id is not None and previous is not None:
        # Only approvals: they continue the turn that asked; answer with its response.
        return await _answer(tenant, store, thread_id, previous_turn, body)
    extras: dict[str, Any] = {}
    if specs or results:
        # Client function tools ride with the input (roder_runtime's client tools).
        extras = {"client_tools": specs, "tool_results": results}
    if instructions is not None:
        extras["instructions"] = instructions

    async def submit(thread: str, turn: str, metadata: Mapping[str, Any], create: bool) -> object:
        return await tenant.dispatcher.submit(
            thread,
            parsed.text or "",
            turn_id=turn,
            engine=engine,
            model=model,
            metadata=metadata,
            create=create,
            **extras,
        )

    create = thread_id is None
    thread_id = thread_id or uuid.uuid4().hex
    # Listening before the thread is created or its last sequence read: the response's
    # stream starts from what this process appends, with no read back (AppendFeed).
    feed = AppendFeed(store, thread_id)
    try:
        with anyio.CancelScope(shield=True):  # a client that leaves does not cancel the run
            turn_id, entry = await _start(store, thread_id, create, params, submit, feed)
    except BaseException:
        feed.close()
        raise
    return await _answer(tenant, store, thread_id, turn_id, body, entry, feed)


async def _answer(
    tenant: Any,
    store: ThreadStore,
    thread_id: str,
    turn_id: str,
    body: Mapping[str, Any],
    params: Mapping[str, Any] | None = None,
    feed: AppendFeed | None = None,
) -> Response:
    if params is None:
        params = await response_params(store, thread_id, turn_id)
    projection = _projection(thread_id, turn_id, params)
    # Its session is here (it was just submitted here): the appends are handed over.
    here = tenant.dispatcher.local_session(thread_id) is not None
    if body.get("stream"):
        return _sse(fold_batches(store, projection, follow=True, runs_here=here, feed=feed), -1)
    follow = not body.get("background")
    async for _ in fold_response(store, projection, follow=follow, runs_here=here, feed=feed):
        pass
    return json_response(projection.response())


def _function_tools(tools: Any) -> tuple[ToolSpec, ...]:
    """Return the request's ``function`` tools as ``ToolSpec`` s (400 for anything else)."""
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list", "tools")
    specs: list[ToolSpec] = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise bad_request("only 'function' tools are accepted", f"tools[{index}]")
        name, parameters = tool.get("name"), tool.get("parameters") or {}
        if not isinstance(name, str) or not isinstance(parameters, Mapping):
            raise bad_request("a function tool needs a 'name'", f"tools[{index}].name")
        specs.append(ToolSpec(name, str(tool.get("description") or ""), dict(parameters)))
    return tuple(specs)


async def get_response(request: Request) -> Response:
    thread_id, turn_id = _thread_of(request.path_params["response_id"])
    store = await tenant_of(request).store()
    projection = _projection(thread_id, turn_id, await response_params(store, thread_id, turn_id))
    if request.query_params.get("stream") in ("true", "1"):
        text = request.query_params.get("starting_after") or "-1"
        try:
            starting_after = int(text)
        except ValueError:
            raise bad_request("'starting_after' must be an integer", "starting_after") from None
        return _sse(fold_batches(store, projection, follow=True), starting_after)
    async for _ in fold_response(store, projection, follow=False):
        pass
    return json_response(projection.response())


async def cancel_response(request: Request) -> Response:
    thread_id, turn_id = _thread_of(request.path_params["response_id"])
    tenant = tenant_of(request)
    store = await tenant.store()
    projection = _projection(thread_id, turn_id, await response_params(store, thread_id, turn_id))
    async for _ in fold_response(store, projection, follow=False):
        pass
    if not projection.done:
        if not await tenant.dispatcher.interrupt(thread_id, turn_id):
            raise OpenAIError(
                409, "another server process runs this response; cancel it there", kind="conflict"
            )
        with anyio.move_on_after(10):
            async for _ in fold_response(store, projection, follow=True):
                pass
    return json_response(projection.response())


async def delete_response(request: Request) -> Response:
    resp_id = request.path_params["response_id"]
    thread_id, turn_id = _thread_of(resp_id)
    store = await tenant_of(request).store()
    await response_params(store, thread_id, turn_id)
    await mark_deleted(store, thread_id, turn_id)
    return json_response({"id": resp_id, "object": "response.deleted", "deleted": True})


async def response_input_items(request: Request) -> Response:
    thread_id, turn_id = _thread_of(request.path_params["response_id"])
    store = await tenant_of(request).store()
    await response_params(store, thread_id, turn_id)
    entries = await store.read_events(thread_id)
    items = [i for i in items_of(entries, turn_id) if i.get("role") == "user"]
    return json_response(list_page(items))


ROUTES = [
    Route("/v1/responses", openai_errors(create_response), methods=["POST"]),
    Route("/v1/responses/{response_id}", openai_errors(get_response), methods=["GET"]),
    Route("/v1/responses/{response_id}", openai_errors(delete_response), methods=["DELETE"]),
    Route("/v1/responses/{response_id}/cancel", openai_errors(cancel_response), methods=["POST"]),
    Route(
        "/v1/responses/{response_id}/input_items",
        openai_errors(response_input_items),
        methods=["GET"],
    ),
    Route("/v1/conversations", openai_errors(create_conversation), methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", openai_errors(get_conversation), methods=["GET"]),
    Route(
        "/v1/conversations/{conversation_id}", openai_errors(update_conversation), methods=["POST"]
    ),
    Route(
        "/v1/conversations/{conversation_id}",
        openai_errors(delete_conversation),
        methods=["DELETE"],
    ),
    Route(
        "/v1/conversations/{conversation_id}/items",
        openai_errors(conversation_items),
        methods=["GET"],
    ),
    Route(
        "/v1/conversations/{conversation_id}/items",
        openai_errors(add_conversation_items),
        methods=["POST"],
    ),
    Route("/v1/models", openai_errors(list_models), methods=["GET"]),
]
"""The OpenAI-compatible routes (mounted by ``create_app``)."""
