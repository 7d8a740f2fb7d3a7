"""``roder plugins``: the installed plugins, their versions and what they registered."""

from __future__ import annotations

import argparse
from typing import Any

import anyio.to_thread

from roder_api.extension import ExtensionRegistry, PluginInfo
from roder_runtime._runtime import load_registry
from roder_runtime.cli._common import EXIT_OK, add_global_flags, add_json_flag, print_json
from roder_runtime.config._config import load_config


def register(subparsers: Any) -> None:
    """Add the ``plugins`` command."""
    parser = subparsers.add_parser(
        "plugins",
        help="list installed plugins",
        description="List installed plugins (limited by RODER_PLUGINS), with load errors.",
        epilog=(
            "examples:\n  roder plugins\n  roder plugins --json\n"
            "  RODER_PLUGINS=jsonl roder plugins"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_json_flag(parser)
    add_global_flags(parser, help=argparse.SUPPRESS)  # `roder plugins --debug` too
    parser.set_defaults(handler=plugins_command)


def _plugin_json(info: PluginInfo, registry: ExtensionRegistry) -> dict[str, Any]:
    """Return a plugin's JSON with ``tool_conflicts``: its tools another plugin registers too
    (neither is used), as the text form's ``tool conflict:`` lines say."""
    data = info.to_json()
    data["tool_conflicts"] = [
        {
            "tool": conflict.id,
            "sources": [conflict.first_source, conflict.second_source],
            "message": str(conflict),
        }
        for name, conflict in registry.tool_conflicts.items()
        if name in info.tools
    ]
    return data


def _load_plugins(config_path: str | None) -> ExtensionRegistry:
    registry = load_registry(load_config(config_path))
    registry.load_all()  # lazy plugins too: this command shows what each one registers
    return registry


async def plugins_command(args: argparse.Namespace) -> int:
    """Print each plugin: name, version, engines, thread stores, or its load error."""
    # Reading the file and importing the plugins block: do it in a worker thread.
    registry = await anyio.to_thread.run_sync(_load_plugins, args.config)
    infos = registry.plugins
    if args.json:
        print_json([_plugin_json(info, registry) for info in infos])
        return EXIT_OK
    if not infos:
        print("no plugins loaded")
        return EXIT_OK
    for info in infos:
        line = f"{info.name} {info.version or '?'}"
        if info.error:
            print(f"{line}  FAILED: {info.error}")
            continue
        parts = []
        for id, reason in info.misconfigured.items():
            parts.append(f"{id} MISCONFIGURED: {reason}")
        if info.engines:
            parts.append("engines: " + ", ".join(info.engines))
        if info.thread_stores:
            parts.append("thread stores: " + ", ".join(info.thread_stores))
        if info.tools:
            parts.append("tools: " + ", ".join(info.tools))
        print(f"{line}  " + "; ".join(parts or ["registers nothing"]))
    for conflict in registry.tool_conflicts.values():
        print(f"tool conflict: {conflict}")
    return EXIT_OK
