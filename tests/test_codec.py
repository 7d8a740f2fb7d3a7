"""Every persisted type round-trips through JSON exactly; unknown fields survive."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from roder_api import codec
from roder_api.errors import UnserializableEventError
from roder_api.events import (
    AssistantContentDelta,
    CompactionCommitted,
    CompactionDiscarded,
    CompactionStarted,
    ContentPhase,
    ErrorEvent,
    ItemCompleted,
    JournalEvent,
    ModelStepStarted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    UsageUpdated,
    WarningEvent,
)
from roder_api.inference import TokenUsage
from roder_api.threads import ThreadMetadata
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    UserMessage,
)

pytestmark = pytest.mark.core

text = st.text(max_size=40)
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=20)
ints = st.integers(min_value=0, max_value=2**53)
json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | text
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=10,
)
json_objects = st.dictionaries(text, json_values, max_size=5)

usages = st.builds(TokenUsage, ints, ints, ints, ints, ints)
items = st.one_of(
    st.builds(UserMessage, text),
    st.builds(AssistantMessage, text, st.booleans()),
    st.builds(Reasoning, text, st.none() | text),
    st.builds(ToolCallRecord, ids, ids, text),
    st.builds(ToolResultRecord, ids, ids, text, json_values, st.booleans()),
    st.builds(ContextCompaction, text),
    st.builds(ProviderMetadata, json_objects),
)
events = st.one_of(
    st.builds(TurnStarted, ids),
    st.builds(ModelStepStarted, ids, ids),
    st.builds(AssistantContentDelta, ids, ids, st.sampled_from(ContentPhase), text),
    st.builds(ItemCompleted, ids, items),
    st.builds(
        UsageUpdated,
        st.none() | ids,
        usages,
        st.sampled_from(["turn", "compaction", "discarded_compaction"]),
    ),
    st.builds(CompactionStarted, st.none() | ids, st.sampled_from(["native", "summary"])),
    st.builds(CompactionCommitted, st.none() | ids),
    st.builds(CompactionDiscarded, st.sampled_from(["failed", "preempted"]), st.none() | ids),
    st.builds(WarningEvent, text),
    st.builds(ErrorEvent, text, st.none() | ids),
    st.builds(TurnComplete, ids, st.none() | text),
    st.builds(TurnAborted, ids, text),
)
metadata = st.builds(
    ThreadMetadata,
    ids,
    ints,
    ints,
    st.none() | text,
    usages,
    ints,
    ints,
    json_objects,
)
records = st.one_of(usages, items, events, metadata, st.builds(JournalEvent, ints, ints, events))


@given(records)
def test_every_record_round_trips_through_json(obj: Any) -> None:
    data = codec.dumps(obj)
    again = codec.loads(data)
    assert again == obj
    assert type(again) is type(obj)
    assert codec.dumps(again) == data


@given(records, st.dictionaries(st.sampled_from(["zz_new", "future_field"]), json_values))
def test_unknown_fields_survive_a_round_trip(obj: Any, extra: dict[str, Any]) -> None:
    data = codec.to_dict(obj)
    data.update(extra)
    loaded = codec.from_dict(data)
    assert dict(loaded.unknown_fields) == extra
    assert codec.to_dict(loaded) == data
    assert orjson.loads(codec.dumps(loaded)) == orjson.loads(orjson.dumps(data))


def test_nested_unknown_fields_survive() -> None:
    data = {
        "type": "journal_event",
        "sequence": 3,
        "recorded_at_ms": 7,
        "event": {
            "type": "item_completed",
            "turn_id": "t",
            "item": {"type": "user_message", "text": "hi", "lang": "en"},
            "origin": "v2",
        },
    }
    assert codec.to_dict(codec.from_dict(data)) == data


def test_unknown_type_tag_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown record type 'from_the_future'"):
        codec.from_dict({"type": "from_the_future"})
    with pytest.raises(ValueError, match="no 'type' key"):
        codec.from_dict({"text": "x"})


def test_missing_required_field_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="bad 'user_message' record"):
        codec.from_dict({"type": "user_message"})


def test_unserializable_values_raise_a_roder_error() -> None:
    with pytest.raises(UnserializableEventError):
        codec.dumps(ToolResultRecord("1", "t", "r", display_payload=object()))


def test_token_usage_adds_field_by_field() -> None:
    total = TokenUsage(1, 2, 3, 4, 5) + TokenUsage(10, 20, 30, 40, 50)
    assert total == TokenUsage(11, 22, 33, 44, 55)
    assert TokenUsage().is_zero() and not total.is_zero()


def test_batch_encoders_refuse_the_whole_batch_clearly() -> None:
    good = UserMessage("ok")
    bad = ToolResultRecord("1", "t", "r", display_payload=float("nan"))
    assert orjson.loads(codec.dumps_list([good, good])) == [codec.to_dict(good)] * 2
    assert codec.dumps_each([good]) == [codec.dumps(good)]
    for encode in (codec.dumps_each, codec.dumps_list):
        with pytest.raises(UnserializableEventError, match="nothing was stored"):
            encode([good, bad])


def test_thread_metadata_open_turns_round_trip() -> None:
    """``open_turns`` survives a round trip as a tuple; metadata written before the field
    existed reads back with none; an unknown field next to it is kept; a bad value is
    refused."""
    meta = ThreadMetadata("t", 1, 2, open_turns=("r1", "r2"))
    back = codec.loads(codec.dumps(meta))
    assert back == meta and back.open_turns == ("r1", "r2")
    old = {"type": "thread_metadata", "thread_id": "t", "created_at_ms": 1, "updated_at_ms": 2}
    assert codec.from_dict(old).open_turns == ()
    newer = codec.from_dict({**old, "open_turns": ["x"], "from_the_future": 1})
    assert newer.open_turns == ("x",)
    assert orjson.loads(codec.dumps(newer))["from_the_future"] == 1
    with pytest.raises(ValueError):
        codec.from_dict({**old, "open_turns": "r1"})
