"""The value rule of the codec: stdlib-``json`` values round-trip, the rest names its path."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from roder_api import codec
from roder_api.errors import UnserializableEventError
from roder_api.events import ItemCompleted, JournalEvent
from roder_api.testing._conformance_values import nested
from roder_api.transcript import ProviderMetadata, UserMessage

pytestmark = pytest.mark.core

# Any text (lone surrogates included), any integer, finite floats.
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec=None))
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(st.characters(codec=None)), children, max_size=4)
    ),
    max_leaves=12,
)


def _typed(value: Any) -> Any:
    """Return ``value`` with each scalar paired with its type (1 and 1.0 differ)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


@given(values)
def test_whatever_stdlib_json_round_trips_the_codec_round_trips(value: Any) -> None:
    assert json.loads(json.dumps(value)) == value  # the premise
    event = ItemCompleted("t", ProviderMetadata({"v": value}))
    back = codec.loads(codec.dumps(event))
    assert _typed(back.item.data) == _typed({"v": value})
    [each] = codec.dumps_each([event])
    assert _typed(codec.loads(each).item.data) == _typed({"v": value})
    [listed] = codec.loads_json(codec.dumps_list([event]))
    assert _typed(codec.from_dict(listed).item.data) == _typed({"v": value})


def test_ordinary_values_take_orjson_and_the_rest_is_marked() -> None:
    plain = ItemCompleted("t", UserMessage("plain ü"))
    assert codec.dumps(plain) == orjson.dumps(codec.to_dict(plain))
    for odd in ("\ud800", 2**64, nested(252)):
        data = codec.dumps(ItemCompleted("t", ProviderMetadata({"v": odd})))
        assert data.startswith(codec.EXACT_MARK) and data.isascii()
        assert codec.loads(data).item.data == {"v": odd}
    big = codec.loads_json(codec.dumps_json({"n": 2**64}))
    assert big == {"n": 2**64} and type(big["n"]) is int


def test_the_nesting_limit_is_exact_and_names_the_path() -> None:
    # The event object is level 1, its item 2, the item's data 3, data["v"] 4.
    at_limit = ItemCompleted("t", ProviderMetadata({"v": nested(codec.MAX_NESTING - 3)}))
    assert codec.loads(codec.dumps(at_limit)) == at_limit
    over = ItemCompleted("t", ProviderMetadata({"v": nested(codec.MAX_NESTING - 2)}))
    with pytest.raises(UnserializableEventError, match=r"item\.data\.v(\[0\])+: nested deeper"):
        codec.dumps(over)
    with pytest.raises(UnserializableEventError, match="event 1 of this batch: item.data.v"):
        codec.dumps_list([at_limit, over])


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": [1, {"b c": object()}]}, "item.data.a[1]['b c']: a object is not JSON data"),
        ([0.0, float("-inf")], "item.data[1]: -inf is not a JSON number"),
        ({2: "x"}, "item.data[2]: the key 2 is a int"),
        ({"s": {1, 2}}, "item.data.s: a set is not JSON data"),
    ],
)
def test_refusals_name_the_path(value: Any, path: str) -> None:
    event = ItemCompleted("t", ProviderMetadata(value))
    for encode in (codec.dumps, lambda e: codec.dumps_each([e]), lambda e: codec.dumps_list([e])):
        with pytest.raises(UnserializableEventError) as caught:
            encode(event)
        assert path in str(caught.value)


def test_a_container_holding_itself_is_refused_without_overflowing() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(UnserializableEventError, match="holds itself"):
        codec.dumps(ItemCompleted("t", ProviderMetadata({"loop": loop})))


def test_bad_exact_json_is_a_decode_error() -> None:
    with pytest.raises(orjson.JSONDecodeError):
        codec.loads_json(b" [1,")
    with pytest.raises(orjson.JSONDecodeError):
        codec.loads_json(b" NaN")


def test_journal_events_equal_what_the_constructor_builds() -> None:
    events = [
        ItemCompleted("t", UserMessage("a")),
        ItemCompleted("t", ProviderMetadata({"n": 2**70, "s": "\ud800"})),
        ItemCompleted("t", UserMessage("b"), unknown_fields={"future": 1}),
    ]
    rows = [(i + 1, 1000 + i, data) for i, data in enumerate(codec.dumps_each(events))]
    rows.append((9, 2000, codec.dumps_each(events[:1])[0].decode()))  # text columns too
    built = codec.journal_events(rows)
    expected = [JournalEvent(seq, at, codec.loads(raw)) for seq, at, raw in rows]
    assert built == expected
    assert [codec.to_dict(e) for e in built] == [codec.to_dict(e) for e in expected]
    assert all(type(e) is JournalEvent and e.unknown_fields == {} for e in built)
    assert built[1].event.item.data == {"n": 2**70, "s": "\ud800"}
    import gc

    assert gc.isenabled()


def test_decoded_records_share_one_empty_unknown_fields_that_cannot_change() -> None:
    import pickle

    first = codec.loads(codec.dumps(ItemCompleted("t", UserMessage("a"))))
    second = codec.loads(codec.dumps(ItemCompleted("t", UserMessage("b"))))
    assert first.unknown_fields is second.item.unknown_fields
    assert first.unknown_fields == {} and isinstance(first.unknown_fields, dict)
    with pytest.raises(TypeError, match="cannot be changed"):
        first.unknown_fields["x"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        first.unknown_fields.update(x=1)  # type: ignore[attr-defined]
    assert first.unknown_fields == {}
    again = pickle.loads(pickle.dumps(first))
    assert again == first and type(again.unknown_fields) is dict
