"""Each package's public surface: sorted ``__all__``, every name real and documented."""

from __future__ import annotations

import importlib
import inspect

import pytest

pytestmark = pytest.mark.core

MODULES = [
    "roder_api",
    "roder_api.codec",
    "roder_api.commands",
    "roder_api.enginekit",
    "roder_api.enginekit.httpx_client",
    "roder_api.errors",
    "roder_api.events",
    "roder_api.extension",
    "roder_api.inference",
    "roder_api.observers",
    "roder_api.storekit",
    "roder_api.testing",
    "roder_api.testing.conformance",
    "roder_api.testing.loopback",
    "roder_api.threads",
    "roder_api.tools",
    "roder_api.tracing",
    "roder_api.transcript",
    "roder_runtime",
    "roder_runtime.threads",
    "roder_jsonl_thread_store",
    "roder_sqlite_thread_store",
    "roder_postgres_thread_store",
    "roder_openai",
    "roder_anthropic",
    "roder_mcp",
    "roder_llm",
    "roder_server",
    "roder_otel",
    "roder_temporal",
]


@pytest.mark.parametrize("module_name", MODULES)
def test_all_is_sorted_and_complete(module_name: str) -> None:
    module = importlib.import_module(module_name)
    names = module.__all__
    assert list(names) == sorted(names), f"{module_name}.__all__ is not sorted"
    assert len(set(names)) == len(names)
    for name in names:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"{module_name}.{name} has no docstring"


def test_contract_names_exist() -> None:
    from roder_api import errors, inference, threads, transcript

    for name in [
        "PluginLoadError",
        "DuplicateRegistrationError",
        "UnknownEngineError",
        "UnknownThreadStoreError",
        "ThreadNotFoundError",
        "ThreadExistsError",
        "InvalidThreadIdError",
        "StoreCorruptedError",
        "CompactionError",
        "CompactionFailed",
        "CompactionPreempted",
        "BusyError",
        "InputTooLargeError",
        "StoppedError",
    ]:
        assert issubclass(getattr(errors, name), errors.RoderError)
    assert issubclass(errors.CompactionFailed, errors.CompactionError)
    assert issubclass(errors.ThreadNotFoundError, LookupError)
    kinds = {k.name for k in inference.ProviderFailureKind}
    assert kinds == {
        "STREAM_INTERRUPTED",
        "RATE_LIMITED",
        "OVERLOADED",
        "TIMEOUT",
        "NETWORK",
        "AUTHENTICATION",
        "INVALID_REQUEST",
        "CONTEXT_WINDOW_EXCEEDED",
        "CONTENT_FILTERED",
        "OTHER",
    }
    assert inference.ProviderFailure(inference.ProviderFailureKind.RATE_LIMITED, "x").retryable
    assert not inference.ProviderFailureKind.AUTHENTICATION.retryable
    assert inference.InferenceCapabilities.text_only().tool_calls is False
    assert threads.ThreadStore.__abstractmethods__
    assert transcript.trim_to_last_compaction_boundary([]) == []


def test_engine_without_compact_turn_has_no_native_compaction() -> None:
    from roder_api.inference import InferenceEngine

    class Plain(InferenceEngine):
        id = "plain"

    class Native(InferenceEngine):
        id = "native"

        async def compact_turn(self, ctx, request):  # type: ignore[no-untyped-def, override]
            yield None

    assert not Plain().supports_native_compaction
    assert Native().supports_native_compaction


# A package may list its own submodule's names (``roder_api`` the registry, ``testing`` the
# kits); these two are in two vocabularies on purpose: ``ProviderMetadata`` is both a
# transcript item and an event an engine yields, and the version is the one single-sourced.
SHARED_ON_PURPOSE = {"ProviderMetadata", "__version__"}


def test_each_public_name_has_one_home() -> None:
    homes: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, (int, str, float)) or name in SHARED_ON_PURPOSE:
                continue
            homes.setdefault(id(obj), []).append(module_name)
            names[id(obj)] = name

    def nested(a: str, b: str) -> bool:  # a package listing its own submodule's name
        return b.startswith(a + ".") or a.startswith(b + ".")

    twice = {
        names[key]: where
        for key, where in homes.items()
        if len(where) > 1 and not (len(where) == 2 and nested(*where))
    }
    assert twice == {}


def test_the_store_kit_names_still_import_from_their_old_home() -> None:
    from roder_api import storekit, threads

    for name in ["BlockingThreadStore", "TurnFold", "encode_cursor", "fold_metadata"]:
        assert getattr(threads, name) is getattr(storekit, name)
        assert name in storekit.__all__ and name not in threads.__all__
    assert storekit.UNSET is threads.UNSET and "UNSET" in threads.__all__
