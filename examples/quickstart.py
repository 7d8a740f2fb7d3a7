"""Roder in one screen: a runtime, the JSONL store and the scripted engine."""

import sys
import tempfile

import anyio

from roder_api import ExtensionRegistryBuilder
from roder_api.testing import ScriptedEngine
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig


async def main(path: str) -> None:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=path))
    async with Runtime(builder.build(), RuntimeConfig()) as runtime:
        thread_id = (await runtime.create_thread(title="quickstart")).thread_id
        for text in ("Hello, Roder!", "Is this durable?"):
            reply = await runtime.run_turn(thread_id, text)
            print(f"you: {text}\nassistant: {reply}")
    async with Runtime(builder.build(), RuntimeConfig()) as runtime:  # a restart
        snapshot = await runtime.load_thread(thread_id)
        assert snapshot is not None
        tokens = snapshot.metadata.usage.total_tokens
        print(f"after a restart: {len(snapshot.items)} items, {tokens} tokens billed")


anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
