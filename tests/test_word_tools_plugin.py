"""The example tool plugin (examples/roder-word-tools) registers and runs its tools."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.tools import ToolContext

from .conftest import REPO


@pytest.fixture
def word_tools() -> Iterator[ModuleType]:
    path = str(REPO / "examples" / "roder-word-tools" / "src")
    sys.path.insert(0, path)
    try:
        yield importlib.import_module("roder_word_tools")
    finally:
        sys.path.remove(path)
        sys.modules.pop("roder_word_tools", None)


@pytest.mark.anyio
async def test_the_plugin_registers_two_tools_that_work(word_tools: ModuleType) -> None:
    builder = ExtensionRegistryBuilder()
    info = builder.load_plugin("word-tools", word_tools)
    assert info.tools == ("word_count", "top_words") and info.hooks == ("register_tools",)
    registry = builder.build()
    count, top = registry.tool("word_count"), registry.tool("top_words")
    assert count.idempotent and top.parameters["properties"]["n"]["default"] == 3
    ctx = ToolContext("t", "u", "c")
    assert await count.call(ctx, {"text": "one two, three"}) == "3"
    assert await top.call(ctx, {"text": "b a b c b a", "n": 2}) == '[["b",3],["a",2]]'
