"""Per-turn instructions: ``UserInput(instructions=...)`` replace the configured
instructions for that turn's model calls only."""

from __future__ import annotations

from pathlib import Path

import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.events import TurnAborted, TurnComplete
from roder_api.testing import ScriptedEngine
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig, UserInput

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def test_a_turns_instructions_replace_the_configured_ones_for_that_turn_only(
    tmp_path: Path,
) -> None:
    engine = ScriptedEngine()
    builder = ExtensionRegistryBuilder().inference_engine(engine)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=tmp_path))
    async with Runtime(builder.build(), RuntimeConfig(instructions="configured")) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            for op in (UserInput("one", instructions="be brief"), UserInput("two")):
                await session.submit(op)
                while not isinstance(
                    (await session.next_event()).event, (TurnComplete, TurnAborted)
                ):
                    pass
    assert [request.instructions for _, request in engine.requests] == ["be brief", "configured"]
