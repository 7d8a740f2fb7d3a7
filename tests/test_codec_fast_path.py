"""The generated fast decoders give exactly what the constructor path gives."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given

from roder_api._record import _decode_general, record_types
from roder_api.codec import dumps, from_dict

from .test_codec import records

pytestmark = pytest.mark.core


@given(records)
def test_fast_and_general_decoding_agree(obj: Any) -> None:
    data = orjson.loads(dumps(obj))
    fast = from_dict(data)
    general = _decode_general(record_types()[data["type"]], data)
    assert fast == general == obj
    assert type(fast) is type(obj)
    assert fast.unknown_fields == {} and isinstance(fast.unknown_fields, dict)


def test_shapes_off_the_fast_path_still_decode_and_fail_as_before() -> None:
    full = {"type": "usage_updated", "turn_id": "t", "usage": {"type": "token_usage"}}
    assert from_dict(full).purpose == "turn"  # a missing default: constructor path
    extra = {**full, "purpose": "turn", "future": 1}
    assert from_dict(extra).unknown_fields == {"future": 1}
    with pytest.raises(ValueError, match="bad 'item_completed' record"):
        from_dict({"type": "item_completed", "item": {"type": "user_message", "text": "x"}})
    with pytest.raises(ValueError, match="unknown record type 'nope'"):
        from_dict({"type": "item_completed", "turn_id": "t", "item": {"type": "nope"}})
