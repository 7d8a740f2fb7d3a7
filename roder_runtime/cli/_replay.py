"""``roder replay``: what the next model call on a thread would receive."""

from __future__ import annotations

import argparse
from typing import Any

from roder_api.codec import to_dict
from roder_api.errors import RoderError
from roder_api.transcript import is_compaction_boundary
from roder_runtime._runtime import DEFAULT_ENGINE
from roder_runtime.cli._common import EXIT_OK, add_command, add_json_flag, open_runtime, print_json
from roder_runtime.cli._ids import resolve_thread_id
from roder_runtime.threads._export import describe_item


def register(subparsers: Any) -> None:
    """Add the ``replay`` command."""
    parser = add_command(
        subparsers,
        "replay",
        help="show what the next model call on a thread would receive",
        description=(
            "Show the replay history of a thread: the instructions and the transcript items "
            "from the last compaction boundary on, exactly what the next model call receives "
            "(followed by the new user message). The journal keeps everything before the "
            "boundary; `roder threads show` shows it."
        ),
        examples=("roder replay ID", "roder replay ID --json | jq '.items | length'"),
    )
    parser.add_argument("thread_id", metavar="ID", help="the thread's id")
    add_json_flag(parser)
    parser.set_defaults(handler=replay_command)


async def replay_command(args: argparse.Namespace) -> int:
    """Print a thread's replay history."""
    async with open_runtime(args) as runtime:
        args.thread_id = await resolve_thread_id(runtime, args.thread_id)
        meta = await runtime.get_thread(args.thread_id)
        items = await runtime.replay_history(args.thread_id)
        engine_id = runtime.config.default_engine or DEFAULT_ENGINE
        try:
            model: str | None = runtime.default_model(runtime.engine(engine_id))
        except RoderError:
            # The configured engine is not installed: still show the history.
            model = runtime.config.default_model
    from_boundary = bool(items) and is_compaction_boundary(items[0])
    if args.json:
        print_json(
            {
                "thread_id": meta.thread_id,
                "engine": engine_id,
                "model": model,
                "instructions": runtime.config.instructions,
                "from_compaction_boundary": from_boundary,
                "history_items": meta.item_count,
                "items": [to_dict(item) for item in items],
            }
        )
        return EXIT_OK
    where = (
        "from the last compaction boundary"
        if from_boundary
        else "the whole history; no compaction boundary"
    )
    print(f"replay of thread {meta.thread_id}: {len(items)} of {meta.item_count} items ({where})")
    print(f"engine: {engine_id}, model: {model or '(engine default)'}")
    if runtime.config.instructions:
        print(f"instructions: {runtime.config.instructions}")
    for number, item in enumerate(items, start=1):
        print(f"[{number}] {describe_item(item)}")
    return EXIT_OK
