"""Misbehaving plugins: the runtime reports each clearly and stays usable for other threads.

Engines that yield wrong types, raise arbitrary exceptions, never finish (a turn deadline
cancels them), yield after being closed, or flood deltas; a store factory that raises on
open; plugins whose import fails or hangs. Each failure ends the affected turn with an
``ErrorEvent`` naming the engine and ``TurnAborted`` (or raises a ``RoderError`` naming the
plugin), and a healthy thread on the same runtime still works afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import CompactionError, RoderError, StoreError
from roder_api.events import (
    AssistantContentDelta,
    ErrorEvent,
    Event,
    ItemCompleted,
    JournalEvent,
    TurnAborted,
    TurnComplete,
)
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    InferenceEngine,
    InferenceEvent,
    InferenceTurnContext,
    MessageDelta,
)
from roder_api.testing import ScriptedEngine
from roder_api.threads import ThreadStore, ThreadStoreFactory
from roder_api.transcript import AssistantMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig

from .conftest import REPO, roder_command

pytestmark = pytest.mark.anyio


class WrongTypes(InferenceEngine):
    """Yields things that are not inference events."""

    id = "wrong-types"

    def __init__(self, junk: object) -> None:
        self.junk = junk

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        yield MessageDelta("fine so far ")
        yield self.junk  # type: ignore[misc]
        yield Completed()


class Raises(InferenceEngine):
    """Raises an arbitrary exception after some output."""

    id = "raises"

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        yield MessageDelta("partial ")
        raise self.error


class NotAGenerator(InferenceEngine):
    """``stream_turn`` returns something that is not an async iterator."""

    id = "not-a-generator"

    def stream_turn(  # type: ignore[override]
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> object:
        return [MessageDelta("a list, not a stream")]


class Hangs(InferenceEngine):
    """Streams a little, then never finishes; counts how often its stream was closed."""

    id = "hangs"

    def __init__(self) -> None:
        self.closed = 0

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        try:
            yield MessageDelta("thinking")
            await anyio.sleep_forever()
            yield Completed()
        finally:
            self.closed += 1


class YieldsAfterClose(InferenceEngine):
    """Ignores being closed and tries to go on yielding."""

    id = "yields-after-close"

    def __init__(self) -> None:
        self.attempts = 0

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        yield MessageDelta("hello")
        try:
            yield Completed()
        except GeneratorExit:
            self.attempts += 1
            yield MessageDelta(" SHOULD NEVER BE SEEN")


class Floods(InferenceEngine):
    """Yields a burst of tiny deltas as fast as it can."""

    id = "floods"

    def __init__(self, count: int) -> None:
        self.count = count

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        for number in range(self.count):
            yield MessageDelta(chr(ord("a") + number % 26))
        yield Completed()


def _runtime(base: Path, *engines: InferenceEngine, **config: Any) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    for engine in engines:
        builder.inference_engine(engine)
    builder.thread_store_factory(JsonlThreadStoreFactory(base, durability="none"))
    return Runtime(builder.build(), RuntimeConfig(**config))


async def _turn(runtime: Runtime, engine: str) -> tuple[str | None, list[JournalEvent]]:
    thread_id = (await runtime.create_thread()).thread_id
    delivered: list[Event] = []

    async def emit(events: Sequence[Event]) -> None:
        delivered.extend(events)

    reply = await runtime.run_turn(thread_id, "hi", emit=emit, engine=engine)
    journal = await (await runtime.store()).read_events(thread_id)
    assert [e.event for e in journal] == delivered, "the journal is not what was delivered"
    return reply, journal


async def _still_usable(runtime: Runtime) -> None:
    reply, journal = await _turn(runtime, "scripted")
    assert reply == "You said: hi"
    assert isinstance(journal[-1].event, TurnComplete)


def _failure(journal: list[JournalEvent], engine_id: str, reason: str = "failed") -> str:
    """Return the error message; check the turn ended with an error naming the engine."""
    errors = [e.event for e in journal if isinstance(e.event, ErrorEvent)]
    assert len(errors) == 1, [type(e.event).__name__ for e in journal]
    assert repr(engine_id) in errors[0].message or engine_id in errors[0].message
    last = journal[-1].event
    assert isinstance(last, TurnAborted) and last.reason == reason
    return errors[0].message


@pytest.mark.parametrize(
    "junk",
    [42, None, "a bare string", b"bytes", ErrorEvent("an event of the wrong layer"), object()],
    ids=["int", "none", "str", "bytes", "session-event", "object"],
)
async def test_an_engine_yielding_wrong_types(tmp_path: Path, junk: object) -> None:
    async with _runtime(tmp_path, WrongTypes(junk)) as runtime:
        reply, journal = await _turn(runtime, "wrong-types")
        assert reply is None
        message = _failure(journal, "wrong-types")
        assert type(junk).__name__ in message
        await _still_usable(runtime)


class PluginBug(Exception):
    """An exception class no one in Roder knows about."""


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad value"),
        KeyError("missing"),
        ZeroDivisionError("division by zero"),
        RuntimeError("boom"),
        PluginBug("a plugin's own error"),
        NotImplementedError("later"),
        StopAsyncIteration(),
        RecursionError("too deep"),
        OSError(5, "Input/output error"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_an_engine_raising_anything(tmp_path: Path, error: BaseException) -> None:
    async with _runtime(tmp_path, Raises(error)) as runtime:
        reply, journal = await _turn(runtime, "raises")
        assert reply is None
        _failure(journal, "raises")
        deltas = [e.event for e in journal if isinstance(e.event, AssistantContentDelta)]
        assert "".join(d.delta for d in deltas) == "partial "
        await _still_usable(runtime)


async def test_an_engine_whose_stream_is_not_a_stream(tmp_path: Path) -> None:
    async with _runtime(tmp_path, NotAGenerator()) as runtime:
        reply, journal = await _turn(runtime, "not-a-generator")
        assert reply is None
        _failure(journal, "not-a-generator")
        await _still_usable(runtime)


async def test_an_engine_that_never_finishes_hits_the_turn_deadline(tmp_path: Path) -> None:
    engine = Hangs()
    async with _runtime(tmp_path, engine, turn_timeout_s=0.5) as runtime:
        started = time.monotonic()
        with anyio.fail_after(30):
            reply, journal = await _turn(runtime, "hangs")
        assert time.monotonic() - started < 20
        assert reply is None
        message = _failure(journal, "hangs", reason="timeout")
        assert "0.5" in message
        assert engine.closed == 1, "the engine's stream was not closed"
        await _still_usable(runtime)


async def test_without_a_deadline_a_slow_turn_is_left_alone(tmp_path: Path) -> None:
    """``turn_timeout_s`` defaults to None: no deadline (a slow model is not an error)."""
    assert RuntimeConfig().turn_timeout_s is None
    engine = ScriptedEngine(id="slow", turns=[[MessageDelta("late"), Completed()]])
    async with _runtime(tmp_path, engine) as runtime:
        reply, _ = await _turn(runtime, "slow")
        assert reply == "late"


async def test_an_engine_that_yields_after_being_closed(tmp_path: Path) -> None:
    engine = YieldsAfterClose()
    async with _runtime(tmp_path, engine) as runtime:
        reply, journal = await _turn(runtime, "yields-after-close")
        assert engine.attempts == 1
        text = "".join(e.event.delta for e in journal if isinstance(e.event, AssistantContentDelta))
        assert "SHOULD NEVER BE SEEN" not in text
        assert text == "hello"
        last = journal[-1].event
        assert isinstance(last, (TurnComplete, TurnAborted))
        if isinstance(last, TurnAborted):
            _failure(journal, "yields-after-close")
        else:
            assert reply == "hello"
        await _still_usable(runtime)


async def test_an_engine_flooding_deltas(tmp_path: Path) -> None:
    count = 20_000
    async with _runtime(tmp_path, Floods(count)) as runtime:
        with anyio.fail_after(60):
            reply, journal = await _turn(runtime, "floods")
        expected = "".join(chr(ord("a") + n % 26) for n in range(count))
        assert reply == expected
        answer = [
            e.event.item
            for e in journal
            if isinstance(e.event, ItemCompleted) and isinstance(e.event.item, AssistantMessage)
        ]
        assert answer == [AssistantMessage(expected)]
        deltas = [e.event for e in journal if isinstance(e.event, AssistantContentDelta)]
        assert "".join(d.delta for d in deltas) == expected
        if hasattr(Runtime, "start_session"):
            assert len(deltas) < count, "the recorder did not coalesce the flood"
        await _still_usable(runtime)


async def test_other_threads_stream_while_an_engine_hangs(tmp_path: Path) -> None:
    engine = Hangs()
    async with _runtime(tmp_path, engine, turn_timeout_s=2.0) as runtime:
        results: list[str | None] = []

        async def healthy() -> None:
            for _ in range(3):
                reply, _ = await _turn(runtime, "scripted")
                results.append(reply)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_turn, runtime, "hangs")
                tg.start_soon(healthy)
        assert results == ["You said: hi"] * 3


class BadCompactor(InferenceEngine):
    """Chats fine; its native compaction yields junk or raises."""

    id = "bad-compactor"

    def __init__(self, failure: str) -> None:
        self.failure = failure

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        yield MessageDelta("ok")
        yield Completed()

    async def compact_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        if self.failure == "junk":
            yield 42  # type: ignore[misc]
        raise PluginBug("the compactor broke")


@pytest.mark.parametrize("failure", ["junk", "raise"])
async def test_an_engine_whose_compaction_misbehaves(tmp_path: Path, failure: str) -> None:
    async with _runtime(tmp_path, BadCompactor(failure)) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.run_turn(thread_id, "hi", engine="bad-compactor")
        history = await runtime.replay_history(thread_id)
        with pytest.raises(CompactionError) as caught:
            await runtime.compact_with_provider(thread_id, "c1", "bad-compactor", None, history)
        assert "int" in str(caught.value) or "PluginBug" in str(caught.value)
        assert await runtime.replay_history(thread_id) == history
        await _still_usable(runtime)


# --- stores ------------------------------------------------------------------------------------


class BrokenFactory(ThreadStoreFactory):
    """Fails to open ``failures`` times, with an exception Roder does not know."""

    id = "broken"

    def __init__(self, base: Path, failures: int) -> None:
        self.base = base
        self.failures = failures

    async def open(self) -> ThreadStore:
        if self.failures:
            self.failures -= 1
            raise OSError(13, "Permission denied", str(self.base))
        return await JsonlThreadStoreFactory(self.base).open()


async def test_a_store_factory_that_raises_on_open(tmp_path: Path) -> None:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(BrokenFactory(tmp_path, failures=2))
    async with Runtime(builder.build(), RuntimeConfig(thread_store="broken")) as runtime:
        for _ in range(2):
            with pytest.raises(StoreError) as caught:
                await runtime.create_thread()
            assert "'broken'" in str(caught.value)
            assert "Permission denied" in str(caught.value)
            assert isinstance(caught.value.__cause__, OSError)
        # Nothing was cached: once the store opens, the runtime works.
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "hi") == "You said: hi"


class RoderErrorFactory(ThreadStoreFactory):
    """Fails to open with a Roder error of its own, which must pass unchanged."""

    id = "refuses"

    async def open(self) -> ThreadStore:
        raise StoreError("the refuses store is read-only today; try tomorrow")


async def test_a_store_factory_raising_a_roder_error_passes_it_on(tmp_path: Path) -> None:
    builder = ExtensionRegistryBuilder()
    builder.thread_store_factory(RoderErrorFactory())
    async with Runtime(builder.build(), RuntimeConfig(thread_store="refuses")) as runtime:
        with pytest.raises(RoderError, match="read-only today"):
            await runtime.list_threads()


# --- plugin imports -----------------------------------------------------------------------------


def _install_fake_plugins(site: Path, plugins: dict[str, str]) -> None:
    """Write modules and one distribution whose entry points name them, under ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    for name, source in plugins.items():
        (site / f"torture_{name}.py").write_text(source)
    info = site / "roder_torture_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: roder-torture-plugins\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[roder]\n" + "".join(f"{name} = torture_{name}\n" for name in plugins)
    )


def test_plugins_whose_import_hangs_or_fails_are_reported(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    site = tmp_path / "site"
    _install_fake_plugins(
        site,
        {
            "hangs": "import threading\nthreading.Event().wait()\n",
            "sleeps": "import time\ntime.sleep(3600)\n",
            "fails": "raise ImportError('needs the frobnicate package')\n",
            "exits": "import sys\nsys.exit(3)\n",
            "typo": "def broken(:\n",
        },
    )
    env = dict(cli_env)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    env["RODER_PLUGIN_IMPORT_TIMEOUT"] = "1"
    env["RODER_PLUGINS"] = "hangs,sleeps,fails,exits,typo,jsonl,scripted"
    started = time.monotonic()
    done = subprocess.run(
        [*roder_command(), "plugins", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert time.monotonic() - started < 30
    assert done.returncode == 0, done.stderr
    infos = {info["name"]: info for info in json.loads(done.stdout)}
    assert "did not finish within 1 s" in infos["hangs"]["error"]
    assert "did not finish within 1 s" in infos["sleeps"]["error"]
    assert "ImportError: needs the frobnicate package" in infos["fails"]["error"]
    assert "SystemExit" in infos["exits"]["error"]
    assert "SyntaxError" in infos["typo"]["error"]
    assert infos["jsonl"]["error"] is None and infos["jsonl"]["thread_stores"] == ["jsonl"]
    assert infos["scripted"]["error"] is None and infos["scripted"]["engines"] == ["scripted"]


def test_a_hung_plugin_does_not_stop_a_chat(tmp_path: Path, cli_env: dict[str, str]) -> None:
    site = tmp_path / "site"
    _install_fake_plugins(site, {"hangs": "import threading\nthreading.Event().wait()\n"})
    env = dict(cli_env)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    env["RODER_PLUGIN_IMPORT_TIMEOUT"] = "1"
    done = subprocess.run(
        [*roder_command(), "chat"],
        input="hello there\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "You said: hello there" in done.stdout
