"""An agent with two tools: find the largest text file of a folder and count its words.

    python examples/agent_with_tools.py [FOLDER]                 # the scripted agent
    python examples/agent_with_tools.py [FOLDER] --engine openai # any configured engine
    python examples/agent_with_tools.py --max-tool-steps 1       # a turn cut at its limit

The task takes several steps: the agent lists the folder (``list_files``), picks the
largest file, counts its words (``count_words``) and answers. Every call, its start and
its result are journaled, so the thread replays exactly after a restart. By default the
scripted engine plays the agent (deterministic, no network); with ``--engine`` the model
of that engine (from ``$RODER_HOME/config.toml``) decides which tools to call.

A turn that ends without an answer (it reached ``max_tool_steps``, the model call failed)
exits with status 1 and says why on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import anyio

from roder_api import ExtensionRegistryBuilder
from roder_api.events import ErrorEvent, Event, ItemCompleted
from roder_api.inference import AgentInferenceRequest, InferenceTurnContext, MessageDelta
from roder_api.testing import ScriptedEngine, ScriptStep, default_reply, tool_call
from roder_api.tools import tool
from roder_api.transcript import ToolCallRecord, ToolResultRecord
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig, load_config

TASK = "Which is the largest .txt file in {folder}, and how many words does it have?"


@tool(idempotent=True)
def list_files(folder: str) -> list[dict[str, object]]:
    """List the .txt files of a folder with their sizes in bytes.

    Args:
        folder: the folder to list
    """
    return [{"name": p.name, "bytes": p.stat().st_size} for p in sorted(Path(folder).glob("*.txt"))]


@tool(idempotent=True)
def count_words(path: str) -> int:
    """Count the words of a text file.

    Args:
        path: the file's path
    """
    return len(Path(path).read_text(encoding="utf-8").split())


def scripted_agent(
    ctx: InferenceTurnContext, request: AgentInferenceRequest, index: int
) -> list[ScriptStep]:
    """Play the agent: list, pick the largest, count, answer (what a model would do)."""
    results = {r.name: r for r in request.transcript if isinstance(r, ToolResultRecord)}
    folder = _folder_of(request)
    if "list_files" not in results:
        return [tool_call("list_files", {"folder": folder}, id="call_list"), *_end(request)]
    files = json.loads(results["list_files"].result)
    if not files:
        return _say(request, f"There is no .txt file in {folder}.")
    largest = max(files, key=lambda f: f["bytes"])
    if "count_words" not in results:
        path = str(Path(folder) / largest["name"])
        return [tool_call("count_words", {"path": path}, id="call_count"), *_end(request)]
    words = results["count_words"].result
    return _say(
        request, f"The largest is {largest['name']} ({largest['bytes']} bytes): {words} words."
    )


def _folder_of(request: AgentInferenceRequest) -> str:
    calls = [c for c in request.transcript if isinstance(c, ToolCallRecord)]
    for call in calls:
        if call.name == "list_files":
            return str(json.loads(call.arguments)["folder"])
    text = str(getattr(request.transcript[-1], "text", ""))
    return text.split(" in ", 1)[1].split(", and", 1)[0] if " in " in text else "."


def _end(request: AgentInferenceRequest) -> list[ScriptStep]:
    return default_reply(request)[-2:]  # usage and Completed


def _say(request: AgentInferenceRequest, text: str) -> list[ScriptStep]:
    return [MessageDelta(text), *_end(request)]


def sample_folder() -> Path:
    """Return a temporary folder with three text files."""
    folder = Path(tempfile.mkdtemp(prefix="roder-agent-"))
    (folder / "short.txt").write_text("a few words\n")
    (folder / "poem.txt").write_text("so much depends upon a red wheel barrow " * 3 + "\n")
    (folder / "note.txt").write_text("buy milk and bread\n")
    return folder


def configured_runtime() -> Runtime:
    """Return a runtime from ``$RODER_HOME/config.toml`` and its plugins, plus our tools."""
    config = load_config()
    builder = ExtensionRegistryBuilder(settings=config.plugin_settings())
    builder.load_entry_points()
    builder.tool(list_files).tool(count_words)
    return Runtime(builder.build(), config, owns_registry=True)


async def main(folder: Path, engine: str | None, threads: Path, max_steps: int | None) -> int:
    if engine is None:
        builder = ExtensionRegistryBuilder()
        builder.inference_engine(ScriptedEngine(turns=scripted_agent))
        builder.thread_store_factory(JsonlThreadStoreFactory(base_path=threads))
        builder.tool(list_files).tool(count_words)
        runtime = Runtime(builder.build(), RuntimeConfig())
    else:
        runtime = await anyio.to_thread.run_sync(configured_runtime)
    if max_steps is not None:
        runtime.config.tools.max_tool_steps = max_steps
    errors: list[str] = []
    async with runtime:
        thread_id = (await runtime.create_thread(title="agent with tools")).thread_id
        task = TASK.format(folder=folder)
        print(f"you: {task}")

        async def show(events: list[Event]) -> None:
            for event in events:
                if isinstance(event, ItemCompleted) and isinstance(event.item, ToolCallRecord):
                    print(f"  -> {event.item.name}({event.item.arguments})")
                elif isinstance(event, ItemCompleted) and isinstance(event.item, ToolResultRecord):
                    print(f"  <- {event.item.result}")
                elif isinstance(event, ErrorEvent):
                    errors.append(event.message)

        reply = await runtime.run_turn(
            thread_id, task, emit=show, engine=engine, tools=["list_files", "count_words"]
        )
    if reply is None:
        # The turn ended without an answer: say why (the journal has it too), and fail.
        reason = "; ".join(errors) or "the turn ended without an answer"
        print(f"agent_with_tools: no answer: {reason}", file=sys.stderr)
        return 1
    print(f"assistant: {reply}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, help="default: a sample folder")
    parser.add_argument("--engine", help="a configured engine id (default: the scripted agent)")
    parser.add_argument("--threads", type=Path, default=None, help="where the JSONL store lives")
    parser.add_argument(
        "--max-tool-steps", type=int, default=None, help="tool steps per turn ([tools] default)"
    )
    args = parser.parse_args()
    sys.exit(
        anyio.run(
            main,
            args.folder or sample_folder(),
            args.engine,
            args.threads or Path(tempfile.mkdtemp(prefix="roder-threads-")),
            args.max_tool_steps,
        )
    )
