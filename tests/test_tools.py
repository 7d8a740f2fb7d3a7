"""Tools: the decorator's schemas, names, registration, conflicts and configuration."""

from __future__ import annotations

import enum
import importlib.metadata
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import ConfigError, DuplicateRegistrationError, UnknownToolError
from roder_api.tools import (
    ApprovalPolicy,
    Tool,
    ToolContext,
    ToolOutput,
    arguments_error,
    check_tool_name,
    tool,
)
from roder_runtime import Runtime, ToolsConfig, load_config

CTX = ToolContext("thread_1", "turn_1", "call_1", {"k": "v"})


class Unit(str, enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


@tool
def forecast(city: str, days: int = 1, unit: Unit = Unit.CELSIUS) -> dict[str, Any]:
    """Return the weather forecast of a city.

    More detail for people.

    Args:
        city: the city's name
        days: how many days ahead
        unit: the temperature unit
    """
    return {"city": city, "days": days, "unit": unit.value}


@tool(name="shout-it", idempotent=True, timeout_s=2.5, requires_approval=True)
async def shout(text: str, ctx: ToolContext, style: Literal["caps", "bang"] = "caps") -> str:
    """Shout a text.

    :param text: what to shout
    :param style: how
    """
    return (text.upper() if style == "caps" else text + "!") + f" in {ctx.call_id}"


def test_the_decorator_builds_the_schema_from_hints_and_docstring() -> None:
    assert isinstance(forecast, Tool) and forecast.name == "forecast"
    assert forecast.description == (
        "Return the weather forecast of a city.\n\nMore detail for people."
    )
    params = forecast.parameters
    assert params["type"] == "object" and params["required"] == ["city"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["city"] == {"type": "string", "description": "the city's name"}
    assert props["days"] == {"type": "integer", "default": 1, "description": "how many days ahead"}
    assert "title" not in params and "title" not in props["city"]
    spec = forecast.spec()
    assert spec.name == "forecast" and spec.parameters == params
    assert not forecast.idempotent and forecast.timeout_s is None
    assert not forecast.requires_approval


def test_the_context_parameter_is_not_part_of_the_schema() -> None:
    assert shout.name == "shout-it" and shout.idempotent and shout.timeout_s == 2.5
    assert shout.requires_approval
    props = shout.parameters["properties"]
    assert set(props) == {"text", "style"}
    assert props["style"]["enum"] == ["caps", "bang"]
    assert props["text"]["description"] == "what to shout"


@pytest.mark.anyio
async def test_calls_convert_arguments_and_results() -> None:
    assert await forecast.call(CTX, {"city": "Oslo", "unit": "fahrenheit"}) == (
        '{"city":"Oslo","days":1,"unit":"fahrenheit"}'
    )
    assert await shout.call(CTX, {"text": "hi"}) == "HI in call_1"

    @tool
    def explicit() -> ToolOutput:
        """Return an explicit output."""
        return ToolOutput("no", is_error=True, display_payload={"x": 1})

    assert await explicit.call(CTX, {}) == ToolOutput("no", True, {"x": 1})
    assert explicit.parameters == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }


def test_arguments_are_checked_against_any_schema() -> None:
    assert arguments_error(forecast.parameters, {"city": "Oslo"}) is None
    assert arguments_error(forecast.parameters, {"days": 2}) == "'city' is a required property"
    assert arguments_error(forecast.parameters, {"city": 3}) == (
        "3 is not of type 'string' (at $.city)"
    )
    unit_error = arguments_error(forecast.parameters, {"city": "x", "unit": "kelvin"})
    assert unit_error is not None and "kelvin" in unit_error
    assert arguments_error({"type": "nonsense"}, {}) is not None
    assert "invalid" in (arguments_error({"type": "nonsense"}, {}) or "")


@pytest.mark.parametrize("name", ["", "a" * 65, "has space", "dot.ted", "ünïcode", None])
def test_invalid_tool_names_are_refused(name: Any) -> None:
    with pytest.raises(ValueError, match="invalid tool name"):
        check_tool_name(name)


def test_valid_tool_names_pass() -> None:
    assert check_tool_name("a" * 64) == "a" * 64
    assert check_tool_name("srv__read-file_2") == "srv__read-file_2"
    with pytest.raises(ValueError, match="invalid tool name"):
        tool(name="bad name")(lambda: "x")


def test_star_arguments_are_refused() -> None:
    def anything(*args: int) -> str:
        """Take anything."""
        return ""

    with pytest.raises(TypeError, match=r"\*args"):
        tool(anything)


class Echo(Tool):
    """A hand-written tool with its own schema."""

    name = "echo"
    description = "Echo the text."
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }

    async def call(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> str:
        return str(arguments["text"])


def test_builder_registers_tools_and_refuses_duplicates_naming_both() -> None:
    builder = ExtensionRegistryBuilder()
    builder.tool(forecast, source="first place")
    builder.tool(Echo())
    with pytest.raises(DuplicateRegistrationError) as info:
        builder.tool(Echo(), source="second place")
    assert "a direct registration" in str(info.value) and "second place" in str(info.value)
    registry = builder.build()
    assert registry.tool("forecast") is forecast
    assert "echo" not in registry.tools  # neither registration is used
    with pytest.raises(DuplicateRegistrationError):
        registry.tool("echo")
    with pytest.raises(UnknownToolError, match="'forecast'"):
        registry.tool("nope")
    with pytest.raises(TypeError, match="expected a Tool"):
        builder.tool("not a tool")  # type: ignore[arg-type]


TOOL_PLUGINS = {
    "tools_a_plugin": """
        from roder_api import hookimpl
        from roder_api.tools import tool

        @tool
        def shared() -> str:
            '''From a.'''
            return "a"

        @tool
        def only_a(x: int) -> int:
            '''Only in a.'''
            return x

        @hookimpl
        def register_tools(register, settings):
            register(shared)
            register(only_a)
    """,
    "tools_b_plugin": """
        from roder_api import hookimpl
        from roder_api.tools import tool

        @tool
        def shared() -> str:
            '''From b.'''
            return "b"

        @hookimpl
        def register_tools(register):
            register(shared)
    """,
    "tools_bad_plugin": """
        from roder_api import hookimpl

        @hookimpl
        def register_tools(register):
            register("not a tool")
    """,
}


@pytest.fixture
def tool_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[importlib.metadata.EntryPoint]:
    for name, source in TOOL_PLUGINS.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return [
        importlib.metadata.EntryPoint(m.removesuffix("_plugin"), m, "roder") for m in TOOL_PLUGINS
    ]


def test_plugins_register_tools_and_a_shared_name_is_used_by_neither(
    tool_entry_points: list[importlib.metadata.EntryPoint],
) -> None:
    builder = ExtensionRegistryBuilder()
    infos = {i.name: i for i in builder.load_entry_points(entry_points=tool_entry_points)}
    registry = builder.build()
    assert infos["tools_a"].tools == ("shared", "only_a") and infos["tools_a"].error is None
    assert infos["tools_a"].to_json()["tools"] == ["shared", "only_a"]
    assert infos["tools_b"].tools == ("shared",)
    assert "register()" in (infos["tools_bad"].error or "")
    assert set(registry.tools) == {"only_a"}
    with pytest.raises(DuplicateRegistrationError) as info:
        registry.tool("shared")
    assert "plugin 'tools_a'" in str(info.value) and "plugin 'tools_b'" in str(info.value)


def test_tools_configuration_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        "[tools]\n"
        'enabled = ["forecast", "echo"]\n'
        "max_tool_steps = 5\n"
        "max_tool_output_bytes = 1000\n"
        "[tools.approval]\n"
        'echo = "ask"\n'
        'forecast = "deny"\n'
        "[mcp_servers.files]\n"
        'command = "python"\n'
        'args = ["-m", "server"]\n'
    )
    config = load_config(path, environ={})
    assert config.tools == ToolsConfig(
        enabled=["forecast", "echo"],
        max_tool_steps=5,
        max_tool_output_bytes=1000,
        approval={"echo": ApprovalPolicy.ASK, "forecast": ApprovalPolicy.DENY},
    )
    assert config.sources["tools.max_tool_steps"] == f"{path}:3"
    assert config.sources["tools.approval.echo"] == f"{path}:6"
    assert config.plugin_settings()["mcp_servers"] == {
        "files": {"command": "python", "args": ["-m", "server"]}
    }
    assert load_config(None, environ={"RODER_HOME": str(tmp_path / "none")}).tools == ToolsConfig()


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("[tools]\nmax_tool_steps = 0\n", 2, "tools.max_tool_steps"),
        ('[tools]\nenabled = "all"\n', 2, "tools.enabled"),
        ("[tools]\nsurprise = 1\n", 2, "tools.surprise"),
        ('[tools]\n[tools.approval]\necho = "maybe"\n', 3, "tools.approval.echo"),
        ('[tools.approval]\n"bad name" = "ask"\n', 2, "tools.approval.bad name"),
    ],
)
def test_bad_tools_configuration_names_file_key_and_line(
    tmp_path: Path, text: str, line: int, key: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.key == key and info.value.line == line
    assert str(info.value).startswith(f"{path}:{line}: ")


def test_a_bad_mcp_table_is_refused_by_its_plugin_with_file_and_line(tmp_path: Path) -> None:
    # [mcp_servers] belongs to the roder-mcp plugin (PLUGIN_TABLES): the loader keeps it raw
    # and the plugin refuses it; the runtime says where it was written.
    path = tmp_path / "config.toml"
    path.write_text("[mcp_servers]\nfiles = 3\n")
    assert load_config(path, environ={}).plugin_tables == {"mcp_servers": {"files": 3}}
    with pytest.raises(ConfigError) as info:
        Runtime.from_config(path, environ={})
    assert f"{path}:2" in str(info.value) and "[mcp_servers.files]" in str(info.value)
