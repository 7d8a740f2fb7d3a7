"""Runtime configuration: dataclasses, the TOML file, environment overrides, provenance."""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from roder_api.errors import ConfigError
from roder_api.tools import ApprovalPolicy, check_tool_name
from roder_runtime.config._lines import NESTED_DEPTH, line_index
from roder_runtime.config._sections import (
    BudgetConfig,
    CompactionConfig,
    ReliabilityConfig,
    ToolsConfig,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEFAULT_HOME = "~/.roder"


def roder_home(environ: Mapping[str, str] | None = None) -> Path:
    """Return ``$RODER_HOME`` (default ``~/.roder``), expanded."""
    env = os.environ if environ is None else environ
    return Path(env.get("RODER_HOME") or DEFAULT_HOME).expanduser()


@dataclass
class RuntimeConfig:
    """Everything the runtime is configured with (a mutable dataclass).

    ``turn_timeout_s`` is a deadline for one turn (None: none): a turn still running when it
    passes is cancelled, its engine stream closed, and it ends with ``ErrorEvent`` and
    ``TurnAborted(reason="timeout")``.

    ``sources`` maps dotted keys to where their value came from (``default``, the file and
    line, or the environment variable), for ``roder config show``.
    """

    max_input_bytes: int = 1024 * 1024
    submission_queue_capacity: int = 64
    recorder_event_capacity: int = 512
    recorder_byte_budget: int = 8 * 1024 * 1024
    thread_store: str | None = None
    thread_store_settings: dict[str, Any] = field(default_factory=dict)
    default_engine: str | None = None
    default_model: str | None = None
    instructions: str | None = None
    turn_timeout_s: float | None = None
    reliability: ReliabilityConfig = field(default_factory=ReliabilityConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    plugin_tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The top-level tables plugins own (:data:`PLUGIN_TABLES`), raw, by name."""
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def mcp_servers(self) -> dict[str, dict[str, Any]]:
        """Return the ``[mcp_servers.<name>]`` tables (the ``roder-mcp`` plugin's)."""
        return self.plugin_tables.setdefault("mcp_servers", {})

    @property
    def server(self) -> dict[str, Any]:
        """Return the raw ``[server]`` table, for ``roder serve`` (its plugin checks it)."""
        return self.plugin_tables.setdefault("server", {})

    @property
    def otel(self) -> dict[str, Any]:
        """Return the raw ``[otel]`` table, for ``roder-otel`` (its plugin checks it)."""
        return self.plugin_tables.setdefault("otel", {})

    def plugin_settings(self) -> dict[str, dict[str, Any]]:
        """Return the settings handed to plugins: engine tables, the store's table, and
        each plugin-owned top-level table under its own name (``settings["mcp_servers"]``).
        """
        settings: dict[str, dict[str, Any]] = {k: dict(v) for k, v in self.engines.items()}
        store_id = self.thread_store or "jsonl"
        settings[store_id] = {**settings.get(store_id, {}), **self.thread_store_settings}
        for name, table in self.plugin_tables.items():
            if table:
                settings[name] = dict(table)
        return settings

    def setting_source(self, settings_id: str, key: str | None) -> str | None:
        """Return where a plugin's setting was written (``config.toml:7``, ``env VAR``).

        ``settings_id`` is the engine or store id (a key of :meth:`plugin_settings`), ``key``
        a key of its table (None: the table itself), dotted for a key in a table inside it
        (``models.m.temperature``; a key not found is given its nearest table's place).
        None when it is not known.
        """
        store_id = self.thread_store or "jsonl"
        tables = ["thread_store"] if settings_id == store_id else []
        tables.append(settings_id if settings_id in PLUGIN_TABLES else f"engines.{settings_id}")
        for table in tables:
            if key is None:
                found = [v for k, v in self.sources.items() if k.startswith(table + ".")]
                if found:
                    return found[0].rsplit(":", 1)[0] if found[0][-1:].isdigit() else found[0]
                continue
            parts = key.split(".")
            for end in range(len(parts), 0, -1):
                dotted = f"{table}.{'.'.join(parts[:end])}"
                if dotted in self.sources:
                    return self.sources[dotted]
        return None


PLUGIN_TABLES: tuple[str, ...] = ("mcp_servers", "server", "otel", "temporal")
"""The top-level tables that belong to plugins, not to the runtime.

Each is kept raw (``RuntimeConfig.plugin_tables``), with the file and line of every key
inside it recorded, and handed to every plugin's hooks as ``settings[<name>]``; the plugin
that owns it checks it and raises ``PluginSettingsError(<name>, "<dotted key>", reason)``
(or reports it through ``misconfigured``), which the runtime prefixes with the key's file
and line. A plugin that needs a table of its own adds its name here.
"""

_TOP_LEVEL_INTS = (
    "max_input_bytes",
    "submission_queue_capacity",
    "recorder_event_capacity",
    "recorder_byte_budget",
)
_TOP_LEVEL_STRS = ("default_engine", "default_model", "instructions")
_TOP_LEVEL_SECONDS = ("turn_timeout_s",)
_SECTIONS: dict[str, type] = {"reliability": ReliabilityConfig, "compaction": CompactionConfig}

_ENV_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("RODER_DEFAULT_ENGINE", "default_engine"),
    ("RODER_DEFAULT_MODEL", "default_model"),
    ("RODER_THREAD_STORE", "thread_store.backend"),
    ("RODER_THREADS_PATH", "thread_store.path"),
    ("RODER_POSTGRES_DSN", "thread_store.dsn"),
)


class _Loader:
    def __init__(self, source: str, text: str | None, sources: dict[str, str]) -> None:
        self.source = source
        self.text = text
        self.sources = sources
        self._index: dict[tuple[str | None, str], int] | None = None
        self.problems: list[ConfigError] | None = None
        """None: the first mistake raises; a list: every mistake is collected in it."""

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        """Collect a ``ConfigError`` raised inside (when collecting), else let it raise."""
        try:
            yield
        except ConfigError as exc:
            if self.problems is None:
                raise
            self.problems.append(exc)

    def line(self, table: str | None, key: str) -> int | None:
        # One pass over the text, not one per key: a file of many keys loads in linear time.
        if self.text is None:
            return None
        if self._index is None:
            self._index = line_index(self.text)
        return self._index.get((table, key))

    def error(self, message: str, table: str | None, key: str) -> ConfigError:
        dotted = f"{table}.{key}" if table else key
        return ConfigError(
            f"{message} (key {dotted!r})",
            source=self.source,
            key=dotted,
            line=self.line(table, key),
        )

    def where(self, table: str | None, key: str) -> str:
        line = self.line(table, key)
        return f"{self.source}:{line}" if line else self.source

    def where_nested(self, table: str, key: str) -> str:
        """Return where ``table.key`` was written: its own line, else its table's.

        A table written as ``[table.key]`` is given its header's line. A key inside an
        inline table (``m = { context_window = 9 }``) has no line of its own: the line that
        opened the inline table is given.
        """
        while True:
            line = self.line(table, key) or self.line(f"{table}.{key}", "")
            if line is not None or "." not in table:
                break
            table, key = table.rsplit(".", 1)
        return f"{self.source}:{line}" if line else self.source

    def note_nested(self, table: str, value: Mapping[str, Any]) -> None:
        """Record where every key of a plugin's ``table`` was written, nested tables too.

        Down to ``NESTED_DEPTH`` tables deep: a deeper key is given its ancestor's place
        (and a hostile file of thousands of dotted levels costs no more).
        """
        pending: list[tuple[str, Mapping[str, Any], int]] = [(table, value, 0)]
        while pending:
            name, mapping, depth = pending.pop()
            for key, item in mapping.items():
                self.sources[f"{name}.{key}"] = self.where_nested(name, key)
                if isinstance(item, Mapping) and depth + 1 < NESTED_DEPTH:
                    pending.append((f"{name}.{key}", item, depth + 1))

    def int_value(self, value: Any, table: str | None, key: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"expected an integer, got {value!r}", table, key)
        if value < minimum:
            raise self.error(f"must be at least {minimum}, got {value}", table, key)
        return value

    def apply(self, data: Mapping[str, Any], config: RuntimeConfig) -> None:
        for key, value in data.items():
            with self.collecting():
                self.apply_one(key, value, config)

    def apply_one(self, key: str, value: Any, config: RuntimeConfig) -> None:
        if key in _TOP_LEVEL_INTS:
            minimum = 1
            setattr(config, key, self.int_value(value, None, key, minimum))
        elif key in _TOP_LEVEL_SECONDS:
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
            ):
                raise self.error(f"expected a number of seconds above 0, got {value!r}", None, key)
            setattr(config, key, float(value))
        elif key in _TOP_LEVEL_STRS:
            if not isinstance(value, str):
                raise self.error(f"expected a string, got {value!r}", None, key)
            setattr(config, key, value)
        elif key == "thread_store":
            self.apply_store(value, config)
            return
        elif key in _SECTIONS:
            self.apply_section(key, value, getattr(config, key))
            return
        elif key == "engines":
            self.apply_engines(value, config)
            return
        elif key == "tools":
            self.apply_tools(value, config.tools)
            return
        elif key == "budget":
            self.apply_budget(value, config.budget)
            return
        elif key in PLUGIN_TABLES:
            self.apply_plugin_table(key, value, config)
            return
        else:
            raise self.error("unknown key", None, key)
        config.sources[key] = self.where(None, key)

    def apply_store(self, value: Any, config: RuntimeConfig) -> None:
        if not isinstance(value, Mapping):
            raise self.error("expected a table", None, "thread_store")
        for key, item in value.items():
            with self.collecting():
                self.apply_store_key(key, item, config)

    def apply_store_key(self, key: str, item: Any, config: RuntimeConfig) -> None:
        if key == "backend":
            if not isinstance(item, str) or not item:
                raise self.error(f"expected a store id, got {item!r}", "thread_store", key)
            config.thread_store = item
        else:
            config.thread_store_settings[key] = item
        config.sources[f"thread_store.{key}"] = self.where("thread_store", key)

    def apply_section(self, name: str, value: Any, target: Any) -> None:
        if not isinstance(value, Mapping):
            raise self.error("expected a table", None, name)
        known = {f.name: f for f in fields(target)}
        for key, item in value.items():
            with self.collecting():
                if key not in known:
                    raise self.error("unknown key", name, key)
                current = getattr(target, key)
                if isinstance(current, bool):
                    if not isinstance(item, bool):
                        raise self.error(f"expected true or false, got {item!r}", name, key)
                elif isinstance(current, int):
                    minimum = 1 if key == "provider_retry_max_attempts" else 0
                    item = self.int_value(item, name, key, minimum)
                elif isinstance(current, float):
                    if isinstance(item, bool) or not isinstance(item, (int, float)):
                        raise self.error(f"expected a number, got {item!r}", name, key)
                    if not 0 <= item <= 1:
                        raise self.error(f"must be between 0 and 1, got {item}", name, key)
                    item = float(item)
                setattr(target, key, item)
                self.sources[f"{name}.{key}"] = self.where(name, key)

    def apply_engines(self, value: Any, config: RuntimeConfig) -> None:
        if not isinstance(value, Mapping):
            raise self.error("expected a table of engine tables", None, "engines")
        for engine_id, table in value.items():
            with self.collecting():
                if not isinstance(table, Mapping):
                    raise self.error("expected a table", "engines", engine_id)
                config.engines[engine_id] = dict(table)
                self.note_nested(f"engines.{engine_id}", table)

    def apply_tools(self, value: Any, target: ToolsConfig) -> None:
        if not isinstance(value, Mapping):
            raise self.error("expected a table", None, "tools")
        for key, item in value.items():
            with self.collecting():
                if key == "enabled":
                    if not isinstance(item, list) or not all(isinstance(n, str) for n in item):
                        raise self.error(
                            f"expected a list of tool names, got {item!r}", "tools", key
                        )
                    target.enabled = list(item)
                elif key in ("max_tool_steps", "max_tool_output_bytes"):
                    setattr(target, key, self.int_value(item, "tools", key, 1))
                elif key == "approval":
                    self.apply_approval(item, target)
                    continue
                else:
                    raise self.error("unknown key", "tools", key)
                self.sources[f"tools.{key}"] = self.where("tools", key)

    def apply_approval(self, value: Any, target: ToolsConfig) -> None:
        if not isinstance(value, Mapping):
            raise self.error("expected a table", "tools", "approval")
        choices = ", ".join(p.value for p in ApprovalPolicy)
        for name, policy in value.items():
            with self.collecting():
                try:
                    check_tool_name(name)
                except ValueError as exc:
                    raise self.error(str(exc), "tools.approval", name) from None
                if policy not in ApprovalPolicy._value2member_map_:
                    raise self.error(
                        f"expected one of {choices}, got {policy!r}", "tools.approval", name
                    )
                target.approval[name] = ApprovalPolicy(policy)
                self.sources[f"tools.approval.{name}"] = self.where("tools.approval", name)

    def apply_budget(self, value: Any, budget: BudgetConfig) -> None:
        if not isinstance(value, Mapping):
            raise self.error("expected a table", None, "budget")
        for key, item in value.items():
            if key not in ("max_usd_per_turn", "max_usd_per_thread"):
                raise self.error("unknown key", "budget", key)
            if (
                isinstance(item, bool)
                or not isinstance(item, (int, float))
                or not math.isfinite(item)
                or item <= 0
            ):
                raise self.error(f"expected an amount in USD above 0, got {item!r}", "budget", key)
            setattr(budget, key, float(item))
            self.sources[f"budget.{key}"] = self.where("budget", key)

    def apply_plugin_table(self, name: str, value: Any, config: RuntimeConfig) -> None:
        """Keep a plugin's top-level table raw, and where each key in it was written."""
        if not isinstance(value, Mapping):
            raise self.error("expected a table", None, name)
        config.plugin_tables[name] = {k: v for k, v in value.items()}
        self.note_nested(name, value)


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """Return ``$RODER_HOME/config.toml``."""
    return roder_home(environ) / "config.toml"


def load_config(
    path_or_mapping: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> RuntimeConfig:
    """Return the configuration from a TOML file or a mapping, with environment overrides.

    With None, ``$RODER_HOME/config.toml`` is read when it exists. Unknown keys and bad
    values raise ``ConfigError`` naming the file, the key and the line.
    """
    return _load(path_or_mapping, environ, None)


def check_config(
    path_or_mapping: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> tuple[RuntimeConfig, list[ConfigError]]:
    """Return the configuration :func:`load_config` reads and every mistake in it.

    Nothing raises for a mistake: each bad key is left at its default and its
    ``ConfigError`` (file, key, line) is in the list, in the file's order.
    """
    problems: list[ConfigError] = []
    try:
        config = _load(path_or_mapping, environ, problems)
    except ConfigError as exc:  # the file cannot be read or parsed: nothing else is known
        return RuntimeConfig(), [exc]
    return config, problems


def _load(
    path_or_mapping: str | os.PathLike[str] | Mapping[str, Any] | None,
    environ: Mapping[str, str] | None,
    problems: list[ConfigError] | None,
) -> RuntimeConfig:
    env = os.environ if environ is None else environ
    config = RuntimeConfig()
    for f in fields(config):
        if f.name not in ("sources", "engines", "thread_store_settings", "plugin_tables"):
            config.sources[f.name] = "default"
    data: Mapping[str, Any]
    if path_or_mapping is None or isinstance(path_or_mapping, (str, os.PathLike)):
        path = Path(path_or_mapping) if path_or_mapping is not None else default_config_path(env)
        if path_or_mapping is None and not path.exists():
            data, loader = {}, _Loader("<defaults>", None, config.sources)
        else:
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                raise ConfigError("configuration file not found", source=str(path)) from None
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"cannot read configuration: {exc}", source=str(path)) from None
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                found = re.search(r"at line (\d+)", str(exc))
                line = getattr(exc, "lineno", None) or (int(found.group(1)) if found else None)
                raise ConfigError(f"invalid TOML: {exc}", source=str(path), line=line) from None
            except RecursionError:
                # tomllib parses nested arrays and tables recursively; hostile nesting would
                # otherwise escape as a RecursionError instead of a configuration error.
                raise ConfigError(
                    "invalid TOML: arrays or tables nested too deeply", source=str(path)
                ) from None
            loader = _Loader(str(path), text, config.sources)
    else:
        data, loader = path_or_mapping, _Loader("<mapping>", None, config.sources)
    loader.problems = problems
    loader.apply(data, config)
    for var, key in _ENV_OVERRIDES:
        value = env.get(var)
        if not value:
            continue
        if key.startswith("thread_store."):
            sub = key.split(".", 1)[1]
            if sub == "backend":
                config.thread_store = value
            elif sub == "dsn" and config.thread_store != "postgres":
                continue  # the PostgreSQL store's DSN; other stores have no such key
            else:
                config.thread_store_settings[sub] = value
        else:
            setattr(config, key, value)
        config.sources[key] = f"env {var}"
    return config
