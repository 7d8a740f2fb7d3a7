"""A child that asks for a tool call's approval, prints ``asked``, and waits to be killed.

python _approval_child.py THREADS_DIR THREAD_ID
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from roder_api import ExtensionRegistryBuilder  # noqa: E402 - after the path setup
from roder_api.events import ToolApprovalRequested  # noqa: E402
from roder_api.testing import ScriptedEngine  # noqa: E402
from roder_api.tools import Tool, tool  # noqa: E402
from roder_jsonl_thread_store import JsonlThreadStoreFactory  # noqa: E402
from roder_runtime import Runtime, RuntimeConfig, UserInput  # noqa: E402


@tool(requires_approval=True)
def wire_money(amount: int) -> str:
    """Send money (needs the user's approval)."""
    return f"sent {amount}"


def build(threads: Path, *tools: Tool) -> Runtime:
    """Return the runtime both the child and the test use."""
    builder = ExtensionRegistryBuilder().inference_engine(ScriptedEngine())
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=threads))
    for t in tools or (wire_money,):
        builder.tool(t)
    return Runtime(builder.build(), RuntimeConfig())


async def main(threads: Path, thread_id: str) -> None:
    async with build(threads) as runtime:
        await runtime.create_thread(thread_id)
        async with runtime.start_session(thread_id) as session:
            await session.submit(UserInput('call wire_money {"amount": 5}'))
            while True:
                event = (await session.next_event()).event
                if isinstance(event, ToolApprovalRequested):
                    print("asked", flush=True)
                    await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1]), sys.argv[2])
