"""The pieces of roder-openai on their own: SSE decoding, replay rules, settings, errors."""

from __future__ import annotations

import email.utils

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai_loopback import sse_events

from roder_api.inference import ProviderFailure, ProviderFailureKind
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    UserMessage,
)
from roder_openai import (
    HANDLED_EVENTS,
    OPENAI_BASE_URL,
    EngineSettings,
    OpenAISettingsError,
    ServerSentEvent,
    SSEDecoder,
    chat_messages,
    redact,
    responses_input,
    retry_after_seconds,
)
from roder_openai._replay import ends_with_unanswered_call, reasoning_metadata

# --- server-sent events ----------------------------------------------------------------------


def decode(*chunks: bytes) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    return events + decoder.end()


def test_sse_multi_line_data_comments_and_fields() -> None:
    stream = (
        b"\xef\xbb\xbf: comment first\n"
        b"event: update\nid: 7\nretry: 1500\ndata: line one\ndata:line two\ndata\n\n"
        b'data: {"a": 1}\n\n'
        b"event: ignored-without-data\n\n"
        b"unknown: field\ndata: last\n\n"
    )
    assert decode(stream) == [
        ServerSentEvent("update", "line one\nline two\n", "7", 1500),
        ServerSentEvent("message", '{"a": 1}', "7", 1500),
        ServerSentEvent("message", "last", "7", 1500),
    ]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_sse_every_line_ending(newline: bytes) -> None:
    stream = newline.join([b"event: e", b"data: x", b"", b"data: y", b"", b""])
    assert decode(stream) == [ServerSentEvent("e", "x"), ServerSentEvent("message", "y")]


def test_sse_an_event_cut_by_the_end_of_the_stream_is_not_dispatched() -> None:
    assert decode(b"data: whole\n\ndata: half") == [ServerSentEvent("message", "whole")]
    assert decode(b"data: a\r\n\r") == [ServerSentEvent("message", "a")]


def test_sse_keeps_unicode_line_separators_inside_data() -> None:
    assert decode("data: a\u2028b\u0085c\n\n".encode()) == [
        ServerSentEvent("message", "a\u2028b\u0085c")
    ]


@given(st.data())
def test_sse_decoding_does_not_depend_on_chunking(data: st.DataObject) -> None:
    raw = b"".join(sse_events("responses_reasoning.sse"))
    raw = raw.replace(b"\n", data.draw(st.sampled_from([b"\n", b"\r\n", b"\r"])))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=40)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert decode(*pieces) == decode(raw)
    assert len(decode(raw)) == 15


# --- replay -----------------------------------------------------------------------------------


def reasoning(item_id: str, encrypted: str | None = "gAAAA-x") -> ProviderMetadata:
    item = {"id": item_id, "type": "reasoning", "summary": []}
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return reasoning_metadata(item)


def kinds(entries: list[dict[str, object]]) -> list[str]:
    return [f"{e.get('type')}:{e.get('role') or e.get('id') or e.get('call_id')}" for e in entries]


def test_replay_starts_with_the_last_boundary_compacted_input() -> None:
    old = {"type": "compaction", "id": "cmp_old", "encrypted_content": "x"}
    new = {"type": "compaction", "id": "cmp_new", "encrypted_content": "y"}
    kept = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "k"}]}
    transcript = [
        UserMessage("before everything"),
        ProviderMetadata({"output": [old], "compacted_input": [old]}),
        UserMessage("between"),
        ProviderMetadata({"output": [new], "compacted_input": [kept, new]}),
        UserMessage("after"),
    ]
    assert kinds(responses_input(transcript)) == [
        "message:user",
        "compaction:cmp_new",
        "message:user",
    ]
    assert responses_input(transcript)[:2] == [kept, new]


def test_a_boundary_without_compacted_input_replays_its_compaction_item() -> None:
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": "x"}
    assert responses_input([ProviderMetadata({"output": [item]})]) == [item]


def test_a_local_summary_boundary_is_replayed_as_a_user_message() -> None:
    entries = responses_input([UserMessage("old"), ContextCompaction("we did X"), UserMessage("n")])
    assert [e["content"][0]["text"] for e in entries] == [
        "Summary of the conversation so far:\n\nwe did X",
        "n",
    ]


def test_calls_and_results_are_replayed_only_in_pairs() -> None:
    transcript = [
        UserMessage("go"),
        ToolCallRecord("c1", "a", "{}"),
        ToolResultRecord("c1", "a", "ok"),
        ToolCallRecord("c2", "b", "{}"),  # interrupted: never answered
        ToolResultRecord("c3", "c", "stray"),  # its call is gone
        UserMessage("again"),
    ]
    assert kinds(responses_input(transcript)) == [
        "message:user",
        "function_call:c1",
        "function_call_output:c1",
        "message:user",
    ]
    assert [m["role"] for m in chat_messages(transcript, None)] == [
        "user",
        "assistant",
        "tool",
        "user",
    ]


def test_reasoning_goes_with_the_item_it_belongs_to_or_not_at_all() -> None:
    transcript = [
        UserMessage("q1"),
        reasoning("rs_1"),
        Reasoning("display text only"),
        AssistantMessage("a1"),
        UserMessage("q2"),
        reasoning("rs_2"),  # its tool call was never answered: both are left out
        ToolCallRecord("c9", "t", "{}"),
        UserMessage("q3"),
        reasoning("rs_3"),  # interrupted before any output: left out
        UserMessage("q4"),
        reasoning("rs_4", encrypted=None),  # cannot be replayed: neither can its message
        AssistantMessage("a4"),
        UserMessage("q5"),
        ProviderMetadata({"provider": "another-engine", "item": {"type": "reasoning"}}),
        AssistantMessage("a5"),
    ]
    assert kinds(responses_input(transcript)) == [
        "message:user",
        "reasoning:rs_1",
        "message:assistant",
        "message:user",
        "message:user",
        "message:user",
        "message:user",
        "message:assistant",
    ]


def test_a_history_ending_in_an_unanswered_call_is_detected() -> None:
    call = ToolCallRecord("c1", "t", "{}")
    assert ends_with_unanswered_call([UserMessage("x"), call])
    assert ends_with_unanswered_call([UserMessage("x"), call, reasoning("rs")])
    assert not ends_with_unanswered_call([UserMessage("x"), call, ToolResultRecord("c1", "t", "r")])
    assert not ends_with_unanswered_call([call, UserMessage("later")])
    assert not ends_with_unanswered_call([])


def test_chat_replay_keeps_a_native_boundary_s_readable_messages() -> None:
    item = {"type": "compaction", "id": "cmp", "encrypted_content": "opaque"}
    kept = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "k"}]}
    transcript = [
        ProviderMetadata({"output": [item], "compacted_input": [kept, item]}),
        UserMessage("n"),
    ]
    assert chat_messages(transcript, "sys") == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "k"},
        {"role": "user", "content": "n"},
    ]


# --- settings ---------------------------------------------------------------------------------


def test_default_settings_send_the_default_key_to_the_default_url() -> None:
    settings = EngineSettings.from_table("openai", None)
    assert (settings.base_url, settings.api_key_env) == (OPENAI_BASE_URL, "OPENAI_API_KEY")


def test_a_custom_base_url_gets_a_key_only_from_its_own_table() -> None:
    custom = EngineSettings.from_table("openai", {"base_url": "http://127.0.0.1:9/v1/"})
    assert custom.api_key_env is None and custom.base_url == "http://127.0.0.1:9/v1"
    own = EngineSettings.from_table("openai", {"base_url": "http://h/v1", "api_key_env": "MY_KEY"})
    assert own.api_key_env == "MY_KEY"
    none = EngineSettings.from_table("openai", {"api_key_env": ""})
    assert none.api_key_env is None and none.api_key() is None


def test_the_key_is_read_per_request_and_never_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = EngineSettings.from_table("openai", {"api_key_env": "RODER_UNIT_KEY"})
    monkeypatch.setenv("RODER_UNIT_KEY", "sk-unit-secret-1")
    assert settings.api_key() == "sk-unit-secret-1"
    assert "sk-unit-secret-1" not in repr(settings)
    monkeypatch.delenv("RODER_UNIT_KEY")
    with pytest.raises(ProviderFailure) as raised:
        settings.api_key()
    assert raised.value.kind is ProviderFailureKind.AUTHENTICATION


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"base_ur": "x"}, "unknown key 'base_ur'"),
        ({"base_url": "ftp://x"}, "base_url"),
        ({"read_timeout": 0}, "read_timeout"),
        ({"context_window": "big"}, "context_window"),
        ({"models": [1]}, "models"),
        ({"api_key_env": 3}, "api_key_env"),
    ],
)
def test_bad_settings_name_the_table_and_key(table: dict[str, object], words: str) -> None:
    with pytest.raises(OpenAISettingsError) as raised:
        EngineSettings.from_table("openai-chat", table)
    assert "[engines.openai-chat]" in str(raised.value) and words in str(raised.value)


# --- errors -----------------------------------------------------------------------------------


def test_retry_after_headers() -> None:
    assert retry_after_seconds(httpx.Headers({"retry-after": "7"})) == 7.0
    assert retry_after_seconds(httpx.Headers({"retry-after": "0.5"})) == 0.5
    assert retry_after_seconds(httpx.Headers({"retry-after-ms": "250", "retry-after": "7"})) == 0.25
    assert retry_after_seconds(httpx.Headers({"retry-after-ms": "x", "retry-after": "2"})) == 2.0
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert retry_after_seconds(httpx.Headers({"retry-after": date}), now=1_000_000) == 30.0
    assert retry_after_seconds(httpx.Headers({"retry-after": "soon"})) is None
    assert retry_after_seconds(httpx.Headers()) is None


def test_redact_removes_the_key_and_key_shaped_text() -> None:
    text = "bad key sk-abc123XYZ789 and sk-proj-****abcd and the raw secret-value"
    cleaned = redact(text, "secret-value")
    assert "sk-abc" not in cleaned and "sk-proj" not in cleaned and "secret-value" not in cleaned


def test_the_handled_responses_events() -> None:
    assert {
        "response.created",
        "response.output_item.added",
        "response.output_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
        "response.failed",
        "response.incomplete",
        "error",
    } <= HANDLED_EVENTS
