"""Compaction boundaries and replay trimming."""

from __future__ import annotations

import pytest

from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    UserMessage,
    is_compaction_boundary,
    trim_to_last_compaction_boundary,
)

pytestmark = pytest.mark.core

NATIVE = ProviderMetadata({"output": [{"type": "compaction", "id": "c1"}]})


def test_boundaries_are_recognised() -> None:
    assert is_compaction_boundary(ContextCompaction("summary"))
    assert is_compaction_boundary(NATIVE)
    assert is_compaction_boundary(
        ProviderMetadata({"output": [{"type": "message"}, {"type": "compaction_summary"}]})
    )
    assert not is_compaction_boundary(ProviderMetadata({"output": [{"type": "reasoning"}]}))
    assert not is_compaction_boundary(ProviderMetadata({"output": "compaction"}))
    assert not is_compaction_boundary(ProviderMetadata({"something": 1}))
    assert not is_compaction_boundary(UserMessage("compaction"))


def test_trim_starts_at_the_last_boundary() -> None:
    history = [
        UserMessage("a"),
        ContextCompaction("first"),
        AssistantMessage("b"),
        NATIVE,
        UserMessage("c"),
    ]
    assert trim_to_last_compaction_boundary(history) == [NATIVE, UserMessage("c")]
    plain = [UserMessage("a"), AssistantMessage("b")]
    assert trim_to_last_compaction_boundary(plain) == plain
    assert trim_to_last_compaction_boundary([]) == []
