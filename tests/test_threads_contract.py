"""``roder_api.threads`` is the public home of the store contract (defined in its own module so
that the store kit and the codec need not import ``roder_api.threads``): the same objects,
the same ``__module__``, the same pickles and type tags as before the split."""

from __future__ import annotations

import pickle
import subprocess
import sys
import typing

import pytest

import roder_api._thread_contract as contract
import roder_api.storekit as storekit
import roder_api.threads as threads
from roder_api import codec
from roder_api._record import record_types
from roder_api.inference import TokenUsage

RECORDS = [
    threads.EventPage,
    threads.LeaseHolder,
    threads.ThreadLease,
    threads.ThreadMetadata,
    threads.ThreadPage,
    threads.ThreadSnapshot,
    threads.Turn,
]


def test_every_public_name_is_the_contracts_or_the_kits_own_object() -> None:
    for name in threads.__all__:
        home = contract if name in contract.__all__ else storekit
        assert getattr(threads, name) is getattr(home, name), name
    assert set(contract.__all__) - {"replay_start", "TurnFold"} <= set(threads.__all__)
    assert threads.replay_start is storekit.replay_start is contract.replay_start


@pytest.mark.parametrize(
    "name", [*(r.__name__ for r in RECORDS), "ThreadStore", "validate_thread_id"]
)
def test_public_names_say_roder_api_threads(name: str) -> None:
    assert getattr(threads, name).__module__ == "roder_api.threads"


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_type_hints_of_the_records_resolve(record: type) -> None:
    assert typing.get_type_hints(record)


def test_pickles_name_roder_api_threads_and_round_trip() -> None:
    meta = threads.ThreadMetadata("t1", 1, 2, title="x", usage=TokenUsage(prompt_tokens=3))
    lease = threads.ThreadLease("t1", threads.LeaseHolder("me", 1, "h", 5))
    for value in (meta, lease, threads.ThreadPage((meta,), None)):
        data = pickle.dumps(value)
        assert b"roder_api.threads" in data and b"_thread_contract" not in data
        assert pickle.loads(data) == value


def test_the_type_tag_and_the_registry_are_unchanged() -> None:
    meta = threads.ThreadMetadata("t1", 1, 2)
    assert codec.to_dict(meta)["type"] == "thread_metadata"
    assert record_types()["thread_metadata"] is threads.ThreadMetadata
    assert codec.loads(codec.dumps(meta)) == meta


@pytest.mark.parametrize(
    "first", ["roder_api.threads", "roder_api.storekit", "roder_api.codec", "roder_api"]
)
def test_each_module_imports_first_in_a_fresh_interpreter(first: str) -> None:
    code = (
        f"import {first}\n"
        "import roder_api.threads as t, roder_api.storekit as k\n"
        "assert t.fold_metadata is k.fold_metadata\n"
        "assert t.ThreadStore.__module__ == 'roder_api.threads'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
