"""``roder config``: the effective configuration and where each value came from."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio.to_thread
import orjson

from roder_api.errors import RoderError
from roder_api.extension import ExtensionRegistry, ExtensionRegistryBuilder
from roder_runtime._runtime import Runtime
from roder_runtime.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    add_command,
    add_json_flag,
    print_json,
)
from roder_runtime.config._check import loaded_problems
from roder_runtime.config._config import (
    PLUGIN_TABLES,
    RuntimeConfig,
    check_config,
    default_config_path,
    load_config,
)

MASK = "********"
"""What a secret is shown as."""

_SECRET_NAME = re.compile(r"key|secret|passw(or)?d|token|auth|credential|cookie", re.I)
_NOT_SECRET_NAME = re.compile(r"(_env|_var|_file|_path)$|max_tokens|tokens?_limit", re.I)
_URL_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*:[^/@\s]*@")
_CONNINFO_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('[^']*'|\S+)", re.I)


def register(subparsers: Any) -> None:
    """Add the ``config`` command group."""
    parser = add_command(
        subparsers,
        "config",
        help="show or check the configuration",
        description="Inspect Roder's configuration ($RODER_HOME/config.toml or --config).",
        examples=(
            "roder config show",
            "roder config check",
            "roder --config ./roder.toml config show --json",
        ),
    )
    sub = parser.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    show = add_command(
        sub,
        "show",
        help="show every setting and where its value came from",
        description=(
            "Show the effective configuration: every setting, its value, and where the value "
            "came from (default, file:line, or an environment variable). Secrets are masked: "
            "settings named like a key, token or password, and passwords in URLs and DSNs. "
            "API keys are never in the file: engines name the variable that holds them "
            "(api_key_env)."
        ),
        examples=("roder config show", "roder config show --json"),
    )
    add_json_flag(show)
    show.set_defaults(handler=show_command)
    check = add_command(
        sub,
        "check",
        help="report every mistake in the configuration, running nothing",
        description=(
            "Load the configuration and every plugin's table without running anything (no "
            "model is called, no MCP server started) and report every mistake at once, each "
            "with its file and line: unknown keys, bad values, engine types and tool names "
            "that do not exist, plugin tables their plugin refuses. Exit status 1 when there "
            "is any mistake, 0 when there is none."
        ),
        examples=("roder config check", "roder --config ./roder.toml config check --json"),
    )
    add_json_flag(check)
    check.set_defaults(handler=check_command)


def _check_registry(config: RuntimeConfig) -> ExtensionRegistry:
    builder = ExtensionRegistryBuilder(
        settings=config.plugin_settings(), locate=config.setting_source, check_only=True
    )
    builder.load_entry_points()
    registry = builder.build()
    registry.load_all()  # every plugin checks its tables (check_only: none starts anything)
    return registry


def registry_mistakes(config: RuntimeConfig, registry: ExtensionRegistry) -> list[str]:
    """Return what the loaded plugins say is wrong with ``config``, one line each."""
    mistakes = [str(problem) for problem in loaded_problems(config, registry)]
    for info in registry.plugins:
        for id, reason in info.misconfigured.items():
            if id.split(".", 1)[0] not in PLUGIN_TABLES:  # those are in loaded_problems
                mistakes.append(f"{id!r} (plugin {info.name!r}) is misconfigured: {reason}")
        if info.error is not None and not info.misconfigured:
            mistakes.append(f"plugin {info.name!r}: {info.error}")
    for engine_id, table in config.engines.items():
        if "type" not in table and engine_id not in registry.engines:
            if engine_id not in registry.misconfigured:
                where = config.sources.get(f"engines.{engine_id}", "")
                where = where.rsplit(":", 1)[0] if where[-1:].isdigit() else where
                mistakes.append(
                    f"{where + ': ' if where else ''}[engines.{engine_id}]: no installed engine "
                    "has this id (a new engine needs a type)"
                )
    store = config.thread_store
    if store is not None and store not in registry.thread_store_factories:
        if store not in registry.misconfigured:
            mistakes.append(
                f"{config.sources.get('thread_store.backend', '')}: [thread_store] backend "
                f"{store!r}: no installed store has this id; installed: "
                f"{', '.join(sorted(registry.thread_store_factories)) or 'none'}"
            )
    return mistakes


async def check_command(args: argparse.Namespace) -> int:
    """Print every mistake in the configuration; exit 1 when there is any."""
    config, problems = await anyio.to_thread.run_sync(check_config, args.config)
    mistakes = [str(problem) for problem in problems]
    registry = await anyio.to_thread.run_sync(_check_registry, config)
    try:
        mistakes.extend(registry_mistakes(config, registry))
    finally:
        await registry.aclose()
    if args.json:
        print_json({"mistakes": mistakes})
    elif mistakes:
        for mistake in mistakes:
            print(mistake)
        print(f"roder config check: {len(mistakes)} mistake(s)", file=sys.stderr)
    else:
        print("no mistakes")
    return EXIT_FAILURE if mistakes else EXIT_OK


def is_secret_name(name: str) -> bool:
    """Return True when a setting named ``name`` holds a secret (``api_key``, ``password``)."""
    return bool(_SECRET_NAME.search(name)) and not _NOT_SECRET_NAME.search(name)


def mask_string(text: str) -> str:
    """Return ``text`` with the password of a URL or a ``password=`` DSN part masked."""
    if _URL_PASSWORD.match(text):
        parts = urlsplit(text)
        user = parts.username or ""
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        text = urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))
    return _CONNINFO_PASSWORD.sub(lambda m: m.group(1) + MASK, text)


def mask(name: str, value: Any) -> Any:
    """Return ``value`` with secrets masked, judged by the setting's ``name`` and content."""
    if value is None:
        return None
    if is_secret_name(name):
        return MASK
    if isinstance(value, str):
        return mask_string(value)
    if isinstance(value, Mapping):
        return {k: mask(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask(name, v) for v in value]
    return value


def _source(config: RuntimeConfig, key: str) -> str:
    """Return where ``key`` (dotted) came from: its own entry, else its table's, else default."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        found = config.sources.get(".".join(parts[:end]))
        if found is not None:
            return found
    return "default"


def effective_settings(config: RuntimeConfig) -> dict[str, dict[str, Any]]:
    """Return ``{dotted key: {"value", "source"}}`` for every setting, secrets masked."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in ("sources", "engines", "thread_store_settings", "plugin_tables"):
            continue
        if f.name == "thread_store":
            values["thread_store.backend"] = value
            for key, item in config.thread_store_settings.items():
                values[f"thread_store.{key}"] = item
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for sub in dataclasses.fields(value):
                values[f"{f.name}.{sub.name}"] = getattr(value, sub.name)
        else:
            values[f.name] = value
    for engine_id, table in config.engines.items():
        for key, item in table.items():
            values[f"engines.{engine_id}.{key}"] = item
    for name, table in config.plugin_tables.items():
        for key, item in table.items():
            values[f"{name}.{key}"] = item
    settings: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        source = _source(config, key)
        if key == "thread_store.backend" and value is None:
            source = config.sources.get(key, "default")
        settings[key] = {"value": mask(key.rsplit(".", 1)[-1], value), "source": source}
    return settings


async def show_command(args: argparse.Namespace) -> int:
    """Print the effective configuration with the source of every value."""
    config = await anyio.to_thread.run_sync(load_config, args.config)
    path = args.config if args.config is not None else str(default_config_path())
    exists = args.config is not None or default_config_path().exists()
    settings = effective_settings(config)
    store = await _describe_store(config)
    if args.json:
        print_json(
            {"config_file": path if exists else None, "thread_store": store, "settings": settings}
        )
        return EXIT_OK
    print(f"config file: {path}" + ("" if exists else " (not found: defaults)"))
    print(f"thread store: {store}")
    shown = {key: _toml(entry["value"]) for key, entry in settings.items()}
    width = max(len(f"{k} = {v}") for k, v in shown.items())
    for key, text in shown.items():
        line = f"{key} = {text}"
        print(f"{line:<{width}}  # {settings[key]['source']}")
    return EXIT_OK


async def _describe_store(config: RuntimeConfig) -> str:
    """Return where threads are stored, as the store plugin describes it (secrets masked)."""
    builder = ExtensionRegistryBuilder(settings=config.plugin_settings())
    builder.load_entry_points()
    try:
        async with Runtime(builder.build(), config, owns_registry=True) as runtime:
            described = runtime.thread_store_factory().describe()
    except RoderError as exc:
        described = f"(unavailable: {exc})"
    return mask_string(described)


def _toml(value: Any) -> str:
    """Return a value written the way config.toml would (unset settings as ``(unset)``)."""
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return orjson.dumps(value).decode()
