"""The ``/v1`` routes: threads, items, events, the stream, runs, approvals, engines."""

from __future__ import annotations

from typing import Any

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from roder_api.codec import to_dict
from roder_api.errors import ThreadNotFoundError
from roder_api.inference import InferenceProviderContext
from roder_api.threads import validate_thread_id
from roder_server._problems import Problem, from_error
from roder_server._runs import MULTITASK, Dispatcher, fold_runs, latest_approval
from roder_server._sse_response import EventStream
from roder_server._stream import journal_stream

JSON = "application/json"


def json_response(body: Any, status: int = 200) -> Response:
    """Return a JSON response."""
    return Response(orjson.dumps(body), status_code=status, media_type=JSON)


def _app(request: Request) -> Any:
    return request.app.state.server.for_request(request)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Problem(400, f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise Problem(422, "the body must be a JSON object")
    return data


def _thread_id(request: Request) -> str:
    thread_id = request.path_params["thread_id"]
    try:
        return validate_thread_id(thread_id)
    except Exception as exc:  # noqa: BLE001 - an invalid id is a 400 like everywhere
        raise from_error(exc) from None


def _int(request: Request, name: str, default: int | None, minimum: int = 0) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise Problem(400, f"{name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise Problem(400, f"{name} must be at least {minimum}, got {value}")
    return value


def _keys(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise Problem(422, f"unknown field {unknown[0]!r} (allowed: {', '.join(allowed)})")


def _opt(body: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        if not (kind is bool and isinstance(value, bool)):
            raise Problem(422, f"{key} must be {what}")
    return value


# --- threads ---------------------------------------------------------------------------


async def list_threads(request: Request) -> Response:
    limit = _int(request, "limit", 50, minimum=1)
    assert limit is not None
    cursor = request.query_params.get("cursor") or None
    store = await _app(request).store()
    try:
        page = await store.list_threads(cursor=cursor, limit=min(limit, 1000))
    except ValueError as exc:
        raise Problem(400, f"bad cursor: {exc}") from None
    return json_response(
        {"threads": [to_dict(m) for m in page.threads], "next_cursor": page.next_cursor}
    )


async def create_thread(request: Request) -> Response:
    body = await _body(request)
    _keys(body, ("thread_id", "title", "extra"))
    thread_id = _opt(body, "thread_id", str, "a string")
    title = _opt(body, "title", str, "a string")
    extra = _opt(body, "extra", dict, "an object")
    if thread_id is not None:
        try:
            validate_thread_id(thread_id)
        except Exception as exc:  # noqa: BLE001
            raise from_error(exc) from None
    runtime = _app(request).runtime
    metadata = await runtime.create_thread(thread_id, title=title, extra=extra)
    return json_response(to_dict(metadata), 201)


async def get_thread(request: Request) -> Response:
    thread_id = _thread_id(request)
    store = await _app(request).store()
    return json_response(to_dict(await store.get_thread(thread_id)))


async def patch_thread(request: Request) -> Response:
    thread_id = _thread_id(request)
    body = await _body(request)
    _keys(body, ("title", "extra"))
    changes: dict[str, Any] = {}
    if "title" in body:
        changes["title"] = _opt(body, "title", str, "a string or null")
    if "extra" in body:
        extra = body["extra"]
        if not isinstance(extra, dict):
            raise Problem(422, "extra must be an object")
        changes["extra"] = extra
    store = await _app(request).store()
    await store.get_thread(thread_id)
    metadata = await store.update_thread(thread_id, **changes)
    return json_response(to_dict(metadata))


async def delete_thread(request: Request) -> Response:
    thread_id = _thread_id(request)
    state = _app(request)
    store = await state.store()
    await store.get_thread(thread_id)
    if state.dispatcher.local_session(thread_id) is not None:
        raise Problem(409, f"a session holds thread {thread_id!r}", error="ThreadBusyError")
    try:
        async with store.lease(thread_id, owner=f"{state.owner} (delete)"):
            await store.delete_thread(thread_id)
    except ThreadNotFoundError:
        raise
    return Response(status_code=204)


async def thread_items(request: Request) -> Response:
    thread_id = _thread_id(request)
    view = request.query_params.get("view", "all")
    if view not in ("all", "replay"):
        raise Problem(400, f"view must be replay or all, got {view!r}")
    store = await _app(request).store()
    if view == "replay":
        entries = await store.replay_events(thread_id)
        items = [to_dict(e.event.item) for e in entries if e.event.TYPE == "item_completed"]
    else:
        snapshot = await store.read_snapshot(thread_id)
        items = [to_dict(item) for item in snapshot.items]
    return json_response({"items": items})


async def thread_events(request: Request) -> Response:
    thread_id = _thread_id(request)
    after = _int(request, "after", 0)
    limit = _int(request, "limit", 1000, minimum=1)
    assert after is not None and limit is not None
    store = await _app(request).store()
    metadata = await store.get_thread(thread_id)
    entries = await store.read_events(thread_id, after=after, limit=min(limit, 10000))
    return json_response(
        {"events": [to_dict(e) for e in entries], "last_sequence": metadata.last_sequence}
    )


async def thread_stream(request: Request) -> Response:
    thread_id = _thread_id(request)
    state = _app(request)
    header = request.headers.get("last-event-id")
    after: int | None
    if header is not None and header.strip():
        try:
            after = int(header)
        except ValueError:
            raise Problem(400, f"Last-Event-ID must be a sequence, got {header!r}") from None
        if after < 0:
            raise Problem(400, "Last-Event-ID must be at least 0")
    else:
        after = _int(request, "after", 0)
    until = request.query_params.get("until")
    if until not in (None, "turn_end"):
        raise Problem(400, f"until must be turn_end, got {until!r}")
    store = await state.store()
    known_last = (await store.get_thread(thread_id)).last_sequence
    if state.streams >= state.settings.max_streams:
        raise Problem(
            503,
            f"{state.streams} streams are open (max_streams)",
            error="BusyError",
            headers={"Retry-After": "5"},
        )
    assert after is not None

    async def body() -> Any:
        state.streams += 1
        try:
            async for chunk in journal_stream(
                store,
                thread_id,
                after,
                heartbeat_s=state.settings.heartbeat_s,
                until_turn_end=until == "turn_end",
                task_group=state.state.waits,
                known_last=known_last,
            ):
                yield chunk
        except ThreadNotFoundError:
            return  # deleted meanwhile: the stream ends
        finally:
            state.streams -= 1

    return EventStream(body())


# --- runs ------------------------------------------------------------------------------


async def create_run(request: Request) -> Response:
    thread_id = _thread_id(request)
    body = await _body(request)
    _keys(body, ("input", "engine", "model", "tools", "turn_id", "multitask"))
    text = body.get("input")
    if not isinstance(text, str):
        raise Problem(422, "input must be a string")
    engine = _opt(body, "engine", str, "a string")
    model = _opt(body, "model", str, "a string")
    turn_id = _opt(body, "turn_id", str, "a string")
    if turn_id is not None:
        try:
            validate_thread_id(turn_id)
        except Exception:  # noqa: BLE001 - same characters as a thread id
            raise Problem(422, f"turn_id {turn_id!r} is not a valid id") from None
    tools = body.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)
    ):
        raise Problem(422, "tools must be a list of tool names")
    multitask = body.get("multitask") or "enqueue"
    if multitask not in MULTITASK:
        raise Problem(422, f"multitask must be one of {', '.join(MULTITASK)}")
    state = _app(request)
    runtime = state.runtime
    if engine is not None:
        runtime.engine(engine)  # 422 for an unknown engine, before anything is journaled
    for name in tools or ():
        runtime.registry.tool(name)
    store = await state.store()
    await store.get_thread(thread_id)
    if turn_id is not None:
        known = fold_runs(thread_id, await store.read_events(thread_id))
        if turn_id in known:
            raise Problem(409, f"turn {turn_id!r} exists", error="ThreadExistsError")
    dispatcher: Dispatcher = state.dispatcher
    with anyio.CancelScope(shield=True):  # a client that leaves does not cancel the run
        accepted, status = await dispatcher.submit(
            thread_id,
            text,
            turn_id=turn_id,
            multitask=multitask,
            engine=engine,
            model=model,
            tools=tools,
        )
    return json_response({"thread_id": thread_id, "turn_id": accepted, "status": status}, 202)


async def get_run(request: Request) -> Response:
    thread_id = _thread_id(request)
    turn_id = request.path_params["turn_id"]
    store = await _app(request).store()
    runs = fold_runs(thread_id, await store.read_events(thread_id))
    run = runs.get(turn_id)
    if run is None:
        raise Problem(404, f"run {turn_id!r} not found on thread {thread_id!r}")
    return json_response(run.to_json())


async def interrupt_run(request: Request) -> Response:
    thread_id = _thread_id(request)
    turn_id = request.path_params["turn_id"]
    state = _app(request)
    store = await state.store()
    runs = fold_runs(thread_id, await store.read_events(thread_id))
    if turn_id not in runs:
        raise Problem(404, f"run {turn_id!r} not found on thread {thread_id!r}")
    if runs[turn_id].status in ("completed", "aborted"):
        return json_response(runs[turn_id].to_json(), 202)
    if not await state.dispatcher.interrupt(thread_id, turn_id):
        raise Problem(
            409,
            f"another process holds thread {thread_id!r}; interrupt there",
            error="ThreadBusyError",
        )
    return json_response(
        {"thread_id": thread_id, "turn_id": turn_id, "status": "interrupting"}, 202
    )


async def approve_call(request: Request) -> Response:
    thread_id = _thread_id(request)
    call_id = request.path_params["call_id"]
    body = await _body(request)
    _keys(body, ("approved", "reason"))
    approved = body.get("approved")
    if not isinstance(approved, bool):
        raise Problem(422, "approved must be true or false")
    reason = _opt(body, "reason", str, "a string")
    state = _app(request)
    store = await state.store()
    asked, decided = latest_approval(await store.read_events(thread_id), call_id)
    if asked is None:
        raise Problem(404, f"no approval was asked for call {call_id!r}")
    if decided:
        raise Problem(409, f"call {call_id!r} is decided already", error="BusyError")
    with anyio.CancelScope(shield=True):
        await state.dispatcher.approve(thread_id, call_id, approved, reason)
    return json_response({"thread_id": thread_id, "call_id": call_id, "approved": approved}, 202)


# --- engines ---------------------------------------------------------------------------


async def list_engines(request: Request) -> Response:
    runtime = _app(request).runtime
    default = runtime.engine(None)
    engines = []
    for engine_id, engine in sorted(runtime.registry.engines.items()):
        ctx = InferenceProviderContext(settings=dict(runtime.config.engines.get(engine_id, {})))
        try:
            with anyio.fail_after(10):
                models = [m.id for m in await engine.list_models(ctx)]
        except Exception:  # noqa: BLE001 - an engine that cannot list: no models shown
            models = []
        engines.append(
            {"id": engine_id, "default_model": runtime.default_model(engine), "models": models}
        )
    return json_response({"engines": engines, "default": default.id})


ROUTES = [
    Route("/v1/engines", list_engines, methods=["GET"]),
    Route("/v1/threads", list_threads, methods=["GET"]),
    Route("/v1/threads", create_thread, methods=["POST"]),
    Route("/v1/threads/{thread_id}", get_thread, methods=["GET"]),
    Route("/v1/threads/{thread_id}", patch_thread, methods=["PATCH"]),
    Route("/v1/threads/{thread_id}", delete_thread, methods=["DELETE"]),
    Route("/v1/threads/{thread_id}/items", thread_items, methods=["GET"]),
    Route("/v1/threads/{thread_id}/events", thread_events, methods=["GET"]),
    Route("/v1/threads/{thread_id}/stream", thread_stream, methods=["GET"]),
    Route("/v1/threads/{thread_id}/runs", create_run, methods=["POST"]),
    Route("/v1/threads/{thread_id}/runs/{turn_id}", get_run, methods=["GET"]),
    Route("/v1/threads/{thread_id}/runs/{turn_id}/interrupt", interrupt_run, methods=["POST"]),
    Route("/v1/threads/{thread_id}/approvals/{call_id}", approve_call, methods=["POST"]),
]
"""The ``/v1`` routes of the contract (other route sets are added beside them)."""
