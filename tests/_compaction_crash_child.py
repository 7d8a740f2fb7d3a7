"""Child process of the compaction crash test (``test_compaction_crash.py``).

Usage: ``python _compaction_crash_child.py BASE_PATH``. It opens a runtime on a JSONL store at
BASE_PATH, prints ``ready``, then reads ``go THREAD_ID SEED`` from stdin and compacts that
thread's replay history once, printing ``commit`` just before the commit batch is written and
``committed`` right after it. The parent kills it with SIGKILL at random points.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from roder_api import ExtensionRegistryBuilder
from roder_api.events import CompactionCommitted, Event, JournalEvent
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    InferenceTurnContext,
    ProviderFailure,
    ProviderFailureKind,
    TokenUsage,
    Usage,
)
from roder_api.testing import Delay, Raise, Script, ScriptedEngine, ScriptStep
from roder_api.transcript import ProviderMetadata
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import ReliabilityConfig, Runtime, RuntimeConfig
from roder_runtime.compaction._compaction import compact
from roder_runtime.store._journal import ThreadJournal

USAGE = TokenUsage(30, 10, 40)


def crash_boundary(seed: int) -> ProviderMetadata:
    """Return the boundary a child compacting with ``seed`` commits."""
    item = {"type": "compaction", "id": f"cmp_crash_{seed}", "encrypted_content": "e" * 64}
    return ProviderMetadata({"output": [item], "compacted_input": [item]})


def script(seed: int) -> list[list[ScriptStep]]:
    """Return the compaction scripts of a seed: sometimes a retried first attempt, with delays."""
    rng = random.Random(seed)
    clean: list[ScriptStep] = [
        crash_boundary(seed),
        Delay(rng.uniform(0, 0.004)),
        Usage(USAGE),
        Delay(rng.uniform(0, 0.004)),
        Completed(),
    ]
    if rng.random() < 0.5:
        interrupted = ProviderFailure(ProviderFailureKind.STREAM_INTERRUPTED, "reset")
        return [[Usage(USAGE), Delay(rng.uniform(0, 0.004)), Raise(interrupted)], clean]
    return [clean]


def say(word: str) -> None:
    sys.stdout.write(word + "\n")
    sys.stdout.flush()


async def run(base: Path) -> int:
    scripts: list[list[ScriptStep]] = []

    def play(ctx: InferenceTurnContext, request: AgentInferenceRequest, index: int) -> Script:
        return scripts[index]

    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine(compactions=play))
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=base))
    config = RuntimeConfig(
        reliability=ReliabilityConfig(
            provider_retry_max_attempts=2, provider_retry_initial_backoff_ms=0
        )
    )
    async with Runtime(builder.build(), config) as runtime:
        await runtime.store()  # opened before "ready": the kill window is the compaction
        say("ready")
        line = (await anyio.to_thread.run_sync(sys.stdin.readline)).split()
        if len(line) != 3 or line[0] != "go":
            return 2
        thread_id, seed = line[1], int(line[2])
        scripts.extend(script(seed))
        history = await runtime.replay_history(thread_id)

        class Announcing(ThreadJournal):
            async def append(
                self, events: Sequence[Event], *, expected_last_sequence: int | None = None
            ) -> list[JournalEvent]:
                committing = any(isinstance(e, CompactionCommitted) for e in events)
                if committing:
                    say("commit")
                entries = await super().append(
                    events, expected_last_sequence=expected_last_sequence
                )
                if committing:
                    say("committed")
                return entries

        plain = await runtime.journal(thread_id)
        await compact(
            Announcing(plain.store, thread_id, store_name=plain.store_name),
            runtime.catalog,
            turn_id="t_compact",
            engine=runtime.engine("scripted"),
            model="scripted-1",
            history=history,
        )
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(run, Path(sys.argv[1])))
