"""The ``llm`` engine: any model an installed simonw/llm plugin offers, driven by Roder.

llm is imported only when the engine is used (listing threads never imports it). Async
models stream on the event loop under asyncio; sync models (and every model under trio,
where llm plugins' asyncio clients cannot run) stream from a worker thread, chunk by chunk,
through a bounded channel. llm's own tool execution is never used: the model's tool calls
come back to Roder as ``ToolCallCompleted`` events, and Roder runs the tools.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import orjson

from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    InferenceCapabilities,
    InferenceEngine,
    InferenceEvent,
    InferenceProviderContext,
    InferenceTurnContext,
    MessageDelta,
    ModelDescriptor,
    ProviderFailure,
    ProviderFailureKind,
    ReasoningDelta,
    TokenUsage,
    ToolCallCompleted,
    ToolSpec,
    Usage,
)
from roder_llm._failures import llm_failure
from roder_llm._history import llm_history
from roder_llm._settings import LlmSettings

ENGINE_ID = "llm"
"""The engine's id: ``roder chat --engine llm --model MODEL``."""

_CHANNEL_SIZE = 64
"""Chunks a worker thread may get ahead of the turn before it waits."""

_LOOKUP_LOCK = threading.Lock()
"""llm loads its plugins on the first lookup, and that load is not safe in two threads at
once (a second thread sees a half-filled registry): lookups take turns."""


def _on_asyncio() -> bool:
    """Return True when the running event loop is asyncio's (anyio's backend says which)."""
    backend = anyio.lowlevel.current_token().backend_class
    return backend.__module__.rsplit(".", 1)[-1] == "_asyncio"


def _find_model(model_id: str, prefer_async: bool) -> Any:
    """Return llm's model object for ``model_id`` (blocking: llm loads its plugins)."""
    import llm

    finders: list[Callable[[str], Any]] = [llm.get_model, llm.get_async_model]
    if prefer_async:
        finders.reverse()
    first: Exception | None = None
    for find in finders:
        try:
            with _LOOKUP_LOCK:
                return find(model_id)
        except llm.UnknownModelError as exc:
            first = first or exc
    assert first is not None
    raise first


def _llm_default_model() -> str:
    """Return llm's default model id (``llm models default``; llm has no type hints here)."""
    import llm

    return str(llm.get_default_model())  # type: ignore[no-untyped-call]


def _llm_tools(specs: Sequence[ToolSpec]) -> list[Any]:
    """Return llm ``Tool`` definitions of the offered tools (no implementation: Roder runs them)."""
    import llm

    return [
        llm.Tool(name=s.name, description=s.description or None, input_schema=dict(s.parameters))
        for s in specs
    ]


def _nested_int(details: Any, *names: str) -> int:
    """Return the first integer found under any of ``names`` in a nested usage mapping."""
    if not isinstance(details, Mapping):
        return 0
    for key, value in details.items():
        if key in names and isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, Mapping):
            found = _nested_int(value, *names)
            if found:
                return found
    return 0


def token_usage(input_tokens: int | None, output_tokens: int | None, details: Any) -> TokenUsage:
    """Return llm's usage (``input``, ``output``, ``details``) as a ``TokenUsage``.

    Roder's ``prompt_tokens`` includes cached and cache-creation tokens. OpenAI-style
    details (``cached_tokens``) are already part of the input count; Anthropic-style ones
    (``cache_read_input_tokens``, ``cache_creation_input_tokens``) are not, so they are added.
    """
    prompt = input_tokens or 0
    completion = output_tokens or 0
    cached = _nested_int(details, "cached_tokens")
    read = _nested_int(details, "cache_read_input_tokens")
    created = _nested_int(details, "cache_creation_input_tokens")
    prompt += read + created
    return TokenUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        cached_prompt_tokens=cached or read,
        cache_creation_prompt_tokens=created,
    )


class LlmEngine(InferenceEngine):
    """An engine for every model the installed llm plugins offer (``llm models``)."""

    id = ENGINE_ID
    capabilities = InferenceCapabilities(streaming=True, tool_calls=True, reasoning=True)

    def __init__(self, settings: LlmSettings | None = None) -> None:
        self.settings = settings or LlmSettings()
        self._models: dict[tuple[str, bool], Any] = {}

    @property
    def default_model(self) -> str:  # type: ignore[override]  # a plain attribute in the base
        """Return ``[engines.llm] model``, else llm's own default (``llm models default``).

        Reading llm's default imports llm, so it is read only when asked (a session starting
        on this engine, ``roder models``), never when plugins are listed.
        """
        if self.settings.model:
            return self.settings.model

        with _LOOKUP_LOCK:
            return _llm_default_model()

    async def list_models(self, ctx: InferenceProviderContext) -> Sequence[ModelDescriptor]:
        """Return the models of every installed llm plugin, llm's default first."""

        def listing() -> list[ModelDescriptor]:
            import llm

            seen: dict[str, ModelDescriptor] = {}
            with _LOOKUP_LOCK:
                entries = llm.get_models_with_aliases()
                default = self.settings.model or _llm_default_model()
            for entry in entries:
                model = entry.model or entry.async_model
                if model is not None and model.model_id not in seen:
                    seen[model.model_id] = ModelDescriptor(model.model_id, display_name=str(model))
            return sorted(seen.values(), key=lambda m: (m.id != default, m.id))

        return await anyio.to_thread.run_sync(listing)

    async def _model(self, model_id: str, prefer_async: bool) -> Any:
        key = (model_id, prefer_async)
        if key not in self._models:
            try:
                found = await anyio.to_thread.run_sync(_find_model, model_id, prefer_async)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a typed one
                raise llm_failure(exc, model_id) from exc
            self._models[key] = found
        return self._models[key]

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        """Yield the reply's deltas, its tool calls, its usage, then ``Completed``."""
        import llm

        model_id = request.model or self.default_model
        model = await self._model(model_id, prefer_async=_on_asyncio())
        history = llm_history(request.transcript, request.instructions)
        kwargs: dict[str, Any] = dict(self.settings.options)
        if request.tools:
            if not getattr(model, "supports_tools", False):
                raise ProviderFailure(
                    ProviderFailureKind.INVALID_REQUEST,
                    f"llm model {model_id!r} does not support tools; offer none or pick "
                    "another model",
                )
            kwargs["tools"] = _llm_tools(request.tools)
        if history.tool_results:
            kwargs["tool_results"] = history.tool_results
        try:
            response = model.prompt(
                history.prompt,
                system=request.instructions or None,
                messages=history.messages,
                stream=True,
                **kwargs,
            )
        except Exception as exc:  # noqa: BLE001 - a bad option, a bad history
            raise llm_failure(exc, model_id) from exc
        is_async = isinstance(model, (llm.AsyncModel, llm.AsyncKeyModel))
        events = self._async_events(response) if is_async else self._thread_events(response)
        try:
            async for event in events:
                kind = getattr(event, "type", "text")
                if kind == "text":
                    yield MessageDelta(event.chunk)
                elif kind == "reasoning" and not getattr(event, "redacted", False):
                    yield ReasoningDelta(event.chunk)
        except ProviderFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the plugin's SDK raised
            raise llm_failure(exc, model_id) from exc
        finally:
            await events.aclose()
        calls = response.tool_calls_or_raise() if is_async else response.tool_calls()
        for index, call in enumerate(calls):
            call_id = call.tool_call_id or f"call_{ctx.turn_id}_{ctx.model_step_id}_{index}"
            arguments = orjson.dumps(call.arguments or {}).decode()
            yield ToolCallCompleted(call_id, call.name, arguments)
        yield Usage(
            token_usage(response.input_tokens, response.output_tokens, response.token_details)
        )
        yield Completed(
            stop_reason="tool_calls" if calls else "stop",
            provider_response_id=getattr(response, "id", None) or None,
        )

    async def _async_events(self, response: Any) -> AsyncGenerator[Any, None]:
        """Yield an async response's stream events, each within the chunk timeout."""
        stream = response.astream_events()
        try:
            while True:
                with anyio.fail_after(self.settings.timeout):
                    try:
                        event = await stream.__anext__()
                    except StopAsyncIteration:
                        return
                yield event
        except TimeoutError as exc:
            raise self._timed_out() from exc
        finally:
            await stream.aclose()

    async def _thread_events(self, response: Any) -> AsyncGenerator[Any, None]:
        """Yield a sync response's stream events, produced in a worker thread."""
        send, receive = anyio.create_memory_object_stream[tuple[str, Any]](_CHANNEL_SIZE)
        token = anyio.lowlevel.current_token()
        stopped = threading.Event()

        def produce(events: Iterator[Any]) -> None:
            outcome: tuple[str, Any] = ("done", None)
            try:
                for event in events:
                    if stopped.is_set():
                        return
                    anyio.from_thread.run(send.send, ("event", event), token=token)
            except anyio.BrokenResourceError:
                return
            except BaseException as exc:  # noqa: BLE001 - handed to the turn, not lost
                outcome = ("error", exc)
            finally:
                try:
                    if not stopped.is_set():
                        anyio.from_thread.run(send.send, outcome, token=token)
                    anyio.from_thread.run_sync(send.close, token=token)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError):
                    pass  # the turn left, or its event loop is gone

        worker = threading.Thread(
            target=produce, args=(response.stream_events(),), name="roder-llm", daemon=True
        )
        worker.start()
        try:
            while True:
                with anyio.fail_after(self.settings.timeout):
                    try:
                        kind, value = await receive.receive()
                    except anyio.EndOfStream:
                        return
                if kind == "event":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    return
        except TimeoutError as exc:
            raise self._timed_out() from exc
        finally:
            # Both ends are closed here, on the loop: the worker may outlive the event
            # loop (a run that ended), and then it can no longer close its end itself.
            stopped.set()
            send.close()
            receive.close()

    def _timed_out(self) -> ProviderFailure:
        return ProviderFailure(
            ProviderFailureKind.TIMEOUT,
            f"the llm model sent nothing for {self.settings.timeout:g} s ([engines.llm] timeout)",
        )
