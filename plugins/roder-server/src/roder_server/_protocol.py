"""What the server needs of the runtime, typed here (the plugin never imports the runtime)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from roder_api.events import JournalEvent
from roder_api.extension import ExtensionRegistry
from roder_api.inference import InferenceEngine, ToolSpec
from roder_api.threads import ThreadMetadata, ThreadStore
from roder_api.transcript import ToolResultRecord


class ServerSession(Protocol):
    """The session methods the server calls (``roder_runtime.Session``)."""

    thread_id: str

    @property
    def running_turn_id(self) -> str | None:
        """Return the id of the turn running now, or None."""
        ...

    @property
    def idle(self) -> bool:
        """Return True when nothing runs, nothing is queued and everything is delivered."""
        ...

    async def submit_input(
        self,
        text: str,
        *,
        turn_id: str | None = None,
        steer: bool = False,
        client_tools: Sequence[ToolSpec] = (),
        tool_results: Sequence[ToolResultRecord] = (),
        instructions: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """Submit input (accepted once it returns); return its turn id. ``metadata`` is
        journaled with the input (``TurnStarted.metadata``)."""
        ...

    def interrupt(self, turn_id: str) -> None:
        """Stop turn ``turn_id``."""
        ...

    def decide_tool_call(self, call_id: str, approved: bool, reason: str | None = None) -> None:
        """Answer a pending approval."""
        ...

    async def next_event(self) -> JournalEvent:
        """Return the next persisted event."""
        ...

    def stop_delivery(self) -> None:
        """Deliver nothing more through :meth:`next_event` (the journal has it all)."""
        ...


class ServerConfig(Protocol):
    """The configuration values the server reads."""

    @property
    def max_input_bytes(self) -> int:
        """Return the largest input a session accepts, in bytes."""
        ...

    @property
    def engines(self) -> Mapping[str, Mapping[str, Any]]:
        """Return the engine tables (``[engines.<id>]``)."""
        ...


class ServerRuntime(Protocol):
    """The runtime methods the server calls (``roder_runtime.Runtime``)."""

    registry: ExtensionRegistry

    @property
    def config(self) -> ServerConfig:
        """Return the runtime's configuration."""
        ...

    async def store(self) -> ThreadStore:
        """Return the open thread store."""
        ...

    async def create_thread(
        self,
        thread_id: str | None = None,
        *,
        title: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> ThreadMetadata:
        """Create a thread; return its metadata."""
        ...

    def engine(self, engine_id: str | None = None) -> InferenceEngine:
        """Return an engine (the default when None)."""
        ...

    def default_model(self, engine: InferenceEngine) -> str:
        """Return the model used on ``engine`` when none is asked for."""
        ...

    def start_session(
        self,
        thread_id: str,
        *,
        engine: str | None = None,
        model: str | None = None,
        owner: str | None = None,
        tools: Sequence[str] | None = None,
        follow_journal: bool = False,
        create: bool = False,
    ) -> AbstractAsyncContextManager[ServerSession]:
        """Return a session on a thread (holds its lease; ``create``: on a new thread)."""
        ...
