"""Plugin discovery: direct registrations, entry points, RODER_PLUGINS, errors by name."""

from __future__ import annotations

import importlib.metadata
import textwrap
from pathlib import Path

import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import (
    DuplicateRegistrationError,
    UnknownEngineError,
    UnknownThreadStoreError,
)
from roder_api.testing import ScriptedEngine
from roder_jsonl_thread_store import JsonlThreadStoreFactory

pytestmark = pytest.mark.core

PLUGINS = {
    "good_engine_plugin": """
        from roder_api import hookimpl
        from roder_api.testing import ScriptedEngine

        @hookimpl
        def register_inference_engines(register, settings):
            window = settings.get("good", {}).get("cw", 1)
            register(ScriptedEngine(id="good", context_window=window))
    """,
    "no_settings_plugin": """
        from roder_api import hookimpl
        from roder_api.testing import ScriptedEngine

        @hookimpl
        def register_inference_engines(register):
            register(ScriptedEngine(id="plain"))
    """,
    "broken_import_plugin": """
        raise ImportError("needs a library that is not installed")
    """,
    "raising_hook_plugin": """
        from roder_api import hookimpl

        @hookimpl
        def register_thread_store_factories(register):
            raise RuntimeError("the hook blew up")
    """,
    "duplicate_engine_plugin": """
        from roder_api import hookimpl
        from roder_api.testing import ScriptedEngine

        @hookimpl
        def register_inference_engines(register):
            register(ScriptedEngine(id="zz-own"))
            register(ScriptedEngine(id="good"))
    """,
    "wrong_type_plugin": """
        from roder_api import hookimpl

        @hookimpl
        def register_inference_engines(register):
            register("not an engine")
    """,
}


@pytest.fixture
def entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[importlib.metadata.EntryPoint]:
    for name, source in PLUGINS.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    names = {
        "good_engine_plugin": "good",
        "no_settings_plugin": "plain",
        "broken_import_plugin": "broken",
        "raising_hook_plugin": "raising",
        "duplicate_engine_plugin": "zz-duplicate",
        "wrong_type_plugin": "wrongtype",
    }
    return [importlib.metadata.EntryPoint(names[m], m, "roder") for m in PLUGINS]


def test_direct_registrations_build_an_immutable_registry(tmp_path: Path) -> None:
    engine = ScriptedEngine()
    factory = JsonlThreadStoreFactory(tmp_path)
    registry = (
        ExtensionRegistryBuilder().inference_engine(engine).thread_store_factory(factory).build()
    )
    assert registry.inference_engine("scripted") is engine
    assert registry.thread_store_factory("jsonl") is factory
    with pytest.raises(TypeError):
        registry.engines["x"] = engine  # type: ignore[index]


def test_duplicate_ids_name_both_sources(tmp_path: Path) -> None:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine(), source="first place")
    with pytest.raises(DuplicateRegistrationError) as info:
        builder.inference_engine(ScriptedEngine(), source="second place")
    assert "first place" in str(info.value) and "second place" in str(info.value)
    assert info.value.id == "scripted"


def test_unknown_ids_list_the_known_ones(tmp_path: Path) -> None:
    registry = (
        ExtensionRegistryBuilder()
        .inference_engine(ScriptedEngine(id="a"))
        .inference_engine(ScriptedEngine(id="b"))
        .build()
    )
    with pytest.raises(UnknownEngineError, match="'a', 'b'") as info:
        registry.inference_engine("c")
    assert isinstance(info.value, LookupError)
    with pytest.raises(UnknownThreadStoreError, match="registered ids: none"):
        registry.thread_store_factory("jsonl")


def test_entry_points_load_and_failures_are_reported_by_name(
    entry_points: list[importlib.metadata.EntryPoint],
) -> None:
    builder = ExtensionRegistryBuilder(settings={"good": {"cw": 77}})
    infos = {
        info.name: info for info in builder.load_entry_points(names=None, entry_points=entry_points)
    }
    registry = builder.build()
    assert set(registry.engines) == {"good", "plain"}
    assert infos["good"].engines == ("good",) and infos["good"].error is None
    assert infos["good"].hooks == ("register_inference_engines",)
    assert infos["plain"].engines == ("plain",)
    assert "ImportError: needs a library that is not installed" == infos["broken"].error
    assert "RuntimeError: the hook blew up" == infos["raising"].error
    # The duplicate plugin registers nothing at all, not even its own id.
    assert "DuplicateRegistrationError" in (infos["zz-duplicate"].error or "")
    assert "'good'" in (infos["zz-duplicate"].error or "")
    assert "zz-own" not in registry.engines
    assert "TypeError" in (infos["wrongtype"].error or "")
    assert [e.plugin for e in registry.load_errors] == [
        "broken",
        "raising",
        "wrongtype",
        "zz-duplicate",
    ]
    assert registry.load_errors[0].args[0].startswith("plugin 'broken' failed to load")


@pytest.mark.anyio
async def test_settings_reach_plugins_that_ask_for_them(
    entry_points: list[importlib.metadata.EntryPoint],
) -> None:
    from roder_api.inference import InferenceProviderContext

    builder = ExtensionRegistryBuilder(settings={"good": {"cw": 77}})
    builder.load_entry_points(names=["good"], entry_points=entry_points)
    models = await builder.build().inference_engine("good").list_models(InferenceProviderContext())
    assert models[0].context_window == 77


def test_roder_plugins_env_limits_loading(
    entry_points: list[importlib.metadata.EntryPoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RODER_PLUGINS", "plain, broken")
    infos = ExtensionRegistryBuilder().load_entry_points(entry_points=entry_points)
    assert [i.name for i in infos] == ["broken", "plain"]
    monkeypatch.setenv("RODER_PLUGINS", "")
    assert ExtensionRegistryBuilder().load_entry_points(entry_points=entry_points) == ()
    monkeypatch.delenv("RODER_PLUGINS")
    assert len(ExtensionRegistryBuilder().load_entry_points(entry_points=entry_points)) == 6


def test_installed_builtin_plugins_are_discovered(monkeypatch: pytest.MonkeyPatch) -> None:
    # This test is about discovery, so it reads the real entry points.
    monkeypatch.delenv("RODER_PLUGINS", raising=False)
    builder = ExtensionRegistryBuilder()
    infos = {i.name: i for i in builder.load_entry_points()}
    assert infos["jsonl"].thread_stores == ("jsonl",)
    assert infos["scripted"].engines == ("scripted",)
    assert infos["jsonl"].version and infos["jsonl"].distribution == "roder-jsonl-thread-store"
