"""The engine kit (``roder_api.enginekit``): the pieces both HTTP engines are built from."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from roder_api.enginekit import (
    EngineSettingsError,
    ServerSentEvent,
    SettingsTable,
    SSEDecoder,
    api_key_from_env,
    check_fits,
    content_text,
    ends_with_unanswered_call,
    error_failure,
    event_json,
    failure_kind_for_status,
    kept_entry,
    paired_tool_ids,
    parse_retry_after,
    parse_retry_after_ms,
    redact,
    split_at_boundary,
    text_characters,
    transport_failure,
)
from roder_api.errors import PluginSettingsError
from roder_api.inference import ProviderFailure, ProviderFailureKind
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
)

K = ProviderFailureKind


def test_importing_the_kit_does_not_import_httpx() -> None:
    code = (
        "import sys, roder_api, roder_api.enginekit, roder_api.inference\n"
        "assert 'httpx' not in sys.modules, sorted(m for m in sys.modules if 'http' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- server-sent events --------------------------------------------------------------------


def decode_in_pieces(stream: bytes, size: int) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    for start in range(0, len(stream), size):
        events += decoder.feed(stream[start : start + size])
    return events + decoder.end()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_sse_lines_end_in_cr_lf_or_crlf_wherever_the_chunks_are_cut(size: int) -> None:
    stream = b"\xef\xbb\xbfevent: a\r\ndata: 1\r\n\r\ndata: 2\rdata: 3\r\r: note\n\ndata: 4\n\n"
    assert decode_in_pieces(stream, size) == [
        ServerSentEvent("a", "1"),
        ServerSentEvent("message", "2\n3"),
        ServerSentEvent("message", "4"),
    ]


@pytest.mark.parametrize("ending", [b"\n", b"\r", b"\r\n"])
def test_many_events_in_one_chunk_and_a_line_cut_between_chunks(ending: bytes) -> None:
    stream = b"".join(b"id: %d%sdata: %d%s%s" % (i, ending, i, ending, ending) for i in range(500))
    decoder = SSEDecoder()
    cut = len(stream) - 3  # inside the last event's data line or its line ends
    events = decoder.feed(stream[:cut] + b"")
    events += decoder.feed(stream[cut:])
    events += decoder.end()
    assert [e.data for e in events] == [str(i) for i in range(500)]
    assert events[-1].id == "499"
    assert decoder.feed(b"data: half") == [] and decoder.end() == []


def test_sse_keeps_unicode_line_separators_inside_data_and_drops_a_cut_event() -> None:
    stream = 'data: {"t": "a\u2028b\u0085c"}\n\ndata: cut'.encode()
    events = decode_in_pieces(stream, 5)
    assert events == [ServerSentEvent("message", '{"t": "a\u2028b\u0085c"}')]
    assert event_json(events[0]) == {"t": "a\u2028b\u0085c"}


def test_an_event_that_is_not_json_is_a_failure_of_kind_other() -> None:
    with pytest.raises(ProviderFailure) as caught:
        event_json(ServerSentEvent("delta", "{not json"))
    assert caught.value.kind is K.OTHER and "(delta)" in str(caught.value)


# --- failures ------------------------------------------------------------------------------


def test_retry_after_reads_seconds_dates_and_milliseconds() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("-1") is None
    assert parse_retry_after("soon") is None
    now = 1_700_000_000.0  # 2023-11-14T22:13:20Z
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:50 GMT", now=now) == 30.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:00:00 GMT", now=now) == 0.0
    assert parse_retry_after_ms("1500") == 1.5
    assert parse_retry_after_ms("x") is None
    assert parse_retry_after_ms("-5") is None
    assert parse_retry_after_ms(None) is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (None, K.OTHER),
        (200, K.OTHER),
        (301, K.INVALID_REQUEST),
        (400, K.INVALID_REQUEST),
        (401, K.AUTHENTICATION),
        (403, K.AUTHENTICATION),
        (404, K.INVALID_REQUEST),
        (429, K.RATE_LIMITED),
        (500, K.OVERLOADED),
        (529, K.OVERLOADED),
    ],
)
def test_each_status_has_its_kind(status: int | None, kind: ProviderFailureKind) -> None:
    assert failure_kind_for_status(status) is kind
    assert error_failure(status, "m", None).kind is kind


def test_an_error_message_is_redacted_and_says_the_status_and_code() -> None:
    key = "sk-the-real-key-0123456789"
    failure = error_failure(
        429, f"slow down {key} (also sk-ant-api03-abcdef***)", key, code="rate", retry_after=2.0
    )
    assert failure.message.startswith("HTTP 429 (rate): slow down [redacted] (also [redacted]")
    assert key not in failure.message and "sk-ant" not in str(failure)
    assert failure.retry_after == 2.0
    assert redact("key pk-abcd1234 rk-xyz9999", None) == "key [redacted] [redacted]"


def test_an_error_without_a_message_falls_back_to_the_reason_phrase() -> None:
    assert error_failure(503, "", None).message == "HTTP 503: Service Unavailable"
    assert error_failure(529, "", None).message == "HTTP 529: error"
    said = error_failure(None, "boom", None, code="overloaded_error").message
    assert said == "the stream reported an error (overloaded_error): boom"


def test_the_kind_of_the_provider_wins_and_context_errors_are_told_apart() -> None:
    failure = error_failure(400, "m", None, kind=K.RATE_LIMITED, retry_after=3.0)
    assert failure.kind is K.RATE_LIMITED and failure.retry_after == 3.0
    assert error_failure(400, "m", None, context_exceeded=True).kind is K.CONTEXT_WINDOW_EXCEEDED
    # Only an invalid request becomes a context error; a retry hint on a failure that is
    # not retried is dropped.
    assert error_failure(500, "m", None, context_exceeded=True).kind is K.OVERLOADED
    refused = error_failure(401, "m", None, retry_after=9.0)
    assert refused.kind is K.AUTHENTICATION and refused.retry_after is None


def test_transport_failures_by_what_went_wrong() -> None:
    error = OSError("refused")
    where = "engine 'x' at http://127.0.0.1:1"

    def kind(**flags: bool) -> ProviderFailure:
        return transport_failure(error, where=where, **flags)

    timed = kind(timed_out=True, unreachable=True, streaming=True)
    assert timed.kind is K.TIMEOUT and timed.message.startswith(where + ": the request timed out")
    cut = kind(timed_out=False, unreachable=True, streaming=True)
    assert cut.kind is K.STREAM_INTERRUPTED
    assert kind(timed_out=False, unreachable=True, streaming=False).kind is K.NETWORK
    other = transport_failure(error, timed_out=False, unreachable=False, streaming=False)
    assert other.kind is K.OTHER and other.message == "HTTP client error (OSError: refused)"


def test_input_that_cannot_fit_is_refused_with_its_size() -> None:
    assert text_characters({"a": "xyz", "skip": "12345", "b": ["12", {"c": "1"}], "n": 5}) == 11
    assert text_characters({"a": "xyz", "skip": "12345"}, frozenset({"skip"})) == 3
    check_fits("m", None, 10**9)
    check_fits("m", 100, 605)
    with pytest.raises(ProviderFailure) as caught:
        check_fits("m", 100, 606)
    assert caught.value.kind is K.CONTEXT_WINDOW_EXCEEDED
    assert "about 152 tokens (606 characters" in str(caught.value)
    assert "nothing was sent" in str(caught.value)


# --- settings ------------------------------------------------------------------------------


class TableError(ValueError):
    def __init__(self, message: str, setting: str | None) -> None:
        super().__init__(message)
        self.setting = setting


def table(values: dict[str, object]) -> SettingsTable:
    return SettingsTable("eng", values, TableError)


READERS: dict[str, Callable[[SettingsTable], object]] = {
    "string": lambda t: t.string("model"),
    "int": lambda t: t.positive_int("n"),
    "seconds": lambda t: t.seconds("timeout", 1.0),
    "boolean": lambda t: t.boolean("b", True),
    "threshold": lambda t: t.threshold(),
    "base_url": lambda t: t.base_url("https://d"),
    "models": lambda t: t.models(None),
    "strict models": lambda t: t.models(None, frozenset({"context_window"})),
}

BAD_VALUES = [
    ("string", {"model": 3}, "[engines.eng] model: expected a string", "model"),
    ("int", {"n": True}, "[engines.eng] n: expected a positive integer", "n"),
    ("int", {"n": 0}, "[engines.eng] n: expected a positive integer", "n"),
    ("seconds", {"timeout": -1}, "timeout: expected a positive number of seconds", "timeout"),
    ("boolean", {"b": "yes"}, "[engines.eng] b: expected true or false", "b"),
    ("threshold", {"compact_threshold": "x"}, 'tokens or "auto"', "compact_threshold"),
    ("base_url", {"base_url": "ftp://x"}, "base_url: expected an http(s) URL", "base_url"),
    ("models", {"models": "m"}, "models: expected a list of ids or a table", "models"),
    ("models", {"models": ["a", ""]}, "models: expected a list of model ids", "models"),
    ("models", {"models": {"a": 1}}, "[engines.eng] models.a: expected a table", "models.a"),
    (
        "models",
        {"models": {"a": {"context_window": "big"}}},
        "[engines.eng] models.a context_window: expected a positive integer",
        "models.a.context_window",
    ),
    (
        "strict models",
        {"models": {"a": {"color": 1}}},
        "[engines.eng] models.a: unknown key 'color'; known keys: context_window",
        "models.a.color",
    ),
]


@pytest.mark.parametrize(("reader", "values", "message", "setting"), BAD_VALUES)
def test_a_bad_value_is_an_error_that_names_the_table_and_key(
    reader: str, values: dict[str, object], message: str, setting: str
) -> None:
    with pytest.raises(TableError) as caught:
        READERS[reader](table(values))
    assert message in str(caught.value)
    assert caught.value.setting == setting


def test_an_engine_settings_error_reads_the_engine_and_key_from_its_message() -> None:
    class MyError(EngineSettingsError):
        pass

    with pytest.raises(MyError) as caught:
        SettingsTable("local-llm", {"models": {"a": {"context_window": 0}}}, MyError).models(1)
    error = caught.value
    assert isinstance(error, PluginSettingsError)
    assert error.settings_id == "local-llm" and error.setting == "models.a.context_window"
    plain = EngineSettingsError("[engines.x] timeout: expected a positive number of seconds")
    assert (plain.settings_id, plain.setting) == ("x", "timeout")
    assert EngineSettingsError("no table here").settings_id == ""


def test_values_and_defaults_are_read() -> None:
    t = table(
        {
            "base_url": "http://h/v1/",
            "timeout": 5,
            "compact_threshold": "auto",
            "models": {"a": {"context_window": 10, "display_name": "A"}, "b": None},
        }
    )
    assert t.base_url("https://d") == "http://h/v1"
    assert t.seconds("timeout", 1.0) == 5.0 and t.seconds("read_timeout", 2.0) == 2.0
    assert t.threshold() == "auto" and table({"compact_threshold": 9}).threshold() == 9
    assert t.boolean("prompt_cache", True) is True
    a, b = t.models(99)
    assert (a.id, a.context_window, a.display_name) == ("a", 10, "A")
    assert (b.id, b.context_window) == ("b", 99)
    assert [m.context_window for m in table({"models": ["x", "y"]}).models(7)] == [7, 7]
    assert t.unknown_key(frozenset({"base_url", "timeout", "compact_threshold"})) == "models"
    assert t.unknown_key(frozenset(t.values)) is None


def test_the_default_key_goes_only_to_the_default_url() -> None:
    default = "https://api.example"
    assert table({}).api_key_env(default, default, "KEY") == "KEY"
    assert table({}).api_key_env("http://127.0.0.1", default, "KEY") is None
    assert table({"api_key_env": "MINE"}).api_key_env("http://127.0.0.1", default, "KEY") == "MINE"
    assert table({"api_key_env": ""}).api_key_env(default, default, "KEY") is None


def test_the_key_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert api_key_from_env(None) is None
    monkeypatch.setenv("RODER_KIT_TEST_KEY", "  sk-abc  ")
    assert api_key_from_env("RODER_KIT_TEST_KEY") == "sk-abc"
    monkeypatch.setenv("RODER_KIT_TEST_KEY", " ")
    with pytest.raises(ProviderFailure) as caught:
        api_key_from_env("RODER_KIT_TEST_KEY")
    assert caught.value.kind is K.AUTHENTICATION and "RODER_KIT_TEST_KEY" in str(caught.value)


# --- replay --------------------------------------------------------------------------------


def boundary() -> ProviderMetadata:
    block = {"type": "compaction", "content": "s"}
    return ProviderMetadata({"provider": "p", "output": [block], "compacted_input": [block]})


def test_replay_starts_after_the_last_boundary_and_pairs_tool_calls() -> None:
    first, last = ContextCompaction("old"), boundary()
    call, result = ToolCallRecord("c1", "t", "{}"), ToolResultRecord("c1", "t", "ok")
    lone_call, lone_result = ToolCallRecord("c2", "t", "{}"), ToolResultRecord("c3", "t", "x")
    items: list[TranscriptItem] = [UserMessage("a"), first, UserMessage("b"), last, call]
    items += [lone_call, result, lone_result]
    found, after = split_at_boundary(items)
    assert found is last and after == [call, lone_call, result, lone_result]
    assert split_at_boundary([UserMessage("a")]) == (None, [UserMessage("a")])
    assert paired_tool_ids(after) == {"c1"}


def test_a_plugin_finds_only_its_own_kept_entries() -> None:
    mine = ProviderMetadata({"provider": "p", "block": {"type": "thinking", "x": 1}})
    assert kept_entry(mine, "p", "block") == {"type": "thinking", "x": 1}
    assert kept_entry(mine, "q", "block") is None
    assert kept_entry(mine, "p", "item") is None
    assert kept_entry(ProviderMetadata({"provider": "p", "block": {"x": 1}}), "p", "block") is None
    assert kept_entry(boundary(), "p", "output") is None
    assert kept_entry(UserMessage("a"), "p", "block") is None


def test_content_text_and_unanswered_calls() -> None:
    assert content_text("t") == "t"
    assert content_text([{"type": "input_text", "text": "a"}, {"image": 1}, {"text": "b"}]) == "ab"
    assert content_text(None) == ""
    call = ToolCallRecord("c1", "t", "{}")
    assert ends_with_unanswered_call([UserMessage("a"), call])
    assert not ends_with_unanswered_call([call, ToolResultRecord("c1", "t", "ok")])
    assert not ends_with_unanswered_call([call, AssistantMessage("x")])
    assert not ends_with_unanswered_call([call, boundary()])
    assert not ends_with_unanswered_call([])


# --- docs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "section"),
    [
        ("roder_api.enginekit", "## 10. The engine kit"),
        ("roder_api.enginekit.httpx_client", "## 10. The engine kit"),
        ("roder_api.testing.loopback", "## 8. Testing against a loopback server"),
    ],
)
def test_every_public_name_of_the_kit_is_documented(module: str, section: str) -> None:
    import importlib

    from .conftest import REPO

    doc = (REPO / "docs" / "writing-an-engine.md").read_text()
    text = doc.split(section, 1)[1].split("\n## ", 1)[0]
    for name in importlib.import_module(module).__all__:
        assert f"`{name}" in text, f"{module}.{name} is not in writing-an-engine.md {section}"
