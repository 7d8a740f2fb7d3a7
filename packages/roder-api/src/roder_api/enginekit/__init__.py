"""The engine kit: what helps people who write HTTP inference engines (public, stable).

``roder_api.inference`` holds the contract an engine implements; this package holds the
pieces both engines of this repository (``roder-openai``, ``roder-anthropic``) are built
from, so that a new engine need not write them again. None of it needs an HTTP client:

- server-sent events over bytes (:class:`SSEDecoder`, :func:`aiter_sse`,
  :func:`event_json`);
- error answers as failures (:func:`error_failure`, :func:`failure_kind_for_status`,
  :func:`transport_failure`), ``Retry-After`` (:func:`parse_retry_after`,
  :func:`parse_retry_after_ms`), key redaction (:func:`redact`), and the refusal of input
  that cannot fit the context window (:func:`check_fits`, :func:`text_characters`);
- ``[engines.<id>]`` tables read with errors that name the key (:class:`SettingsTable`,
  :class:`EngineSettingsError`),
  and the key read from the environment per request (:func:`api_key_from_env`);
- replay: the last boundary (:func:`split_at_boundary`), tool calls only in pairs
  (:func:`paired_tool_ids`), the plugin's own kept items (:func:`kept_entry`).

``roder_api.enginekit.httpx_client`` adds the httpx half (a lazily made client, the
streaming loop, transport errors); it imports httpx, so only an engine that depends on
httpx imports it. See ``docs/writing-an-engine.md``.
"""

from __future__ import annotations

from roder_api.enginekit._failures import (
    CHARS_PER_TOKEN_BOUND,
    CHARS_PER_TOKEN_ESTIMATE,
    KEY_PATTERN,
    MAX_ERROR_BODY,
    check_fits,
    error_failure,
    failure_kind_for_status,
    parse_retry_after,
    parse_retry_after_ms,
    reason_phrase,
    redact,
    text_characters,
    transport_failure,
)
from roder_api.enginekit._replay import (
    SUMMARY_PREFIX,
    content_text,
    ends_with_unanswered_call,
    kept_entry,
    paired_tool_ids,
    split_at_boundary,
)
from roder_api.enginekit._settings import (
    EngineSettingsError,
    SettingsErrorFactory,
    SettingsTable,
    api_key_from_env,
)
from roder_api.enginekit._sse import ServerSentEvent, SSEDecoder, aiter_sse, event_json

__all__ = [
    "CHARS_PER_TOKEN_BOUND",
    "CHARS_PER_TOKEN_ESTIMATE",
    "EngineSettingsError",
    "KEY_PATTERN",
    "MAX_ERROR_BODY",
    "SSEDecoder",
    "SUMMARY_PREFIX",
    "ServerSentEvent",
    "SettingsErrorFactory",
    "SettingsTable",
    "aiter_sse",
    "api_key_from_env",
    "check_fits",
    "content_text",
    "ends_with_unanswered_call",
    "error_failure",
    "event_json",
    "failure_kind_for_status",
    "kept_entry",
    "paired_tool_ids",
    "parse_retry_after",
    "parse_retry_after_ms",
    "reason_phrase",
    "redact",
    "split_at_boundary",
    "text_characters",
    "transport_failure",
]
