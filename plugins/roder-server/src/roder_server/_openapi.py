"""The OpenAPI 3.1 document of the server (hand-written: the routes are few and fixed)."""

from __future__ import annotations

from typing import Any

from roder_api import __version__
from roder_api.events import EVENT_TYPES
from roder_server.openai._openapi import openai_paths, openai_schemas

_PROBLEM = {"$ref": "#/components/schemas/Problem"}
_OBJ: dict[str, Any] = {"type": "object"}


def _problems(*codes: int) -> dict[str, Any]:
    return {
        str(code): {
            "description": "a problem (RFC 9457)",
            "content": {"application/problem+json": {"schema": _PROBLEM}},
        }
        for code in codes
    }


def _json(description: str, schema: dict[str, Any], code: int = 200) -> dict[str, Any]:
    return {
        str(code): {"description": description, "content": {"application/json": {"schema": schema}}}
    }


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": False, "content": {"application/json": {"schema": schema}}}


_THREAD_ID = {"name": "thread_id", "in": "path", "required": True, "schema": {"type": "string"}}
_TURN_ID = {"name": "turn_id", "in": "path", "required": True, "schema": {"type": "string"}}
_CALL_ID = {"name": "call_id", "in": "path", "required": True, "schema": {"type": "string"}}
_COMMON = (400, 401, 404, 413, 503)
_META = {"$ref": "#/components/schemas/ThreadMetadata"}
_ITEM = {"$ref": "#/components/schemas/Item"}
_EVENT = {"$ref": "#/components/schemas/JournalEvent"}
_USAGE = {"$ref": "#/components/schemas/TokenUsage"}
_EVENT_TYPES = sorted(kind.TYPE for kind in EVENT_TYPES)
"""The journal events' ``type`` tags (the codec's wire form)."""
_SSE_MESSAGE = {
    "type": "object",
    "description": "one server-sent event: `id` the journal sequence, `event` the event's type, "
    "`data` the journal_event JSON (a `retry` and `: keepalive` comments carry no data)",
    "required": ["id", "event", "data"],
    "properties": {
        "id": {"type": "string", "pattern": "^[1-9][0-9]*$"},
        "event": {"enum": _EVENT_TYPES},
        "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": _EVENT},
        "retry": {"type": "integer", "minimum": 0},
    },
}
_ITEM_TYPES = [
    "user_message",
    "assistant_message",
    "reasoning",
    "tool_call",
    "tool_result",
    "context_compaction",
    "provider_metadata",
]
"""The transcript items' ``type`` tags (the codec's wire form)."""


def openapi_document() -> dict[str, Any]:
    """Return the OpenAPI 3.1 document (served at ``/openapi.json``)."""
    run_body = {
        "type": "object",
        "required": ["input"],
        "additionalProperties": False,
        "properties": {
            "input": {"type": "string"},
            "engine": {"type": "string"},
            "model": {"type": "string"},
            "tools": {"type": "array", "items": {"type": "string"}},
            "turn_id": {"type": "string"},
            "multitask": {"enum": ["enqueue", "reject", "interrupt", "steer"]},
        },
    }
    run_status = {
        "type": "object",
        "required": ["thread_id", "turn_id", "status"],
        "properties": {
            "thread_id": {"type": "string"},
            "turn_id": {"type": "string"},
            "status": {"type": "string"},
            "reason": {"type": "string"},
            "usage": _USAGE,
        },
    }
    engines = {
        "type": "object",
        "required": ["engines", "default"],
        "properties": {
            "engines": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "default_model", "models"],
                    "properties": {
                        "id": {"type": "string"},
                        "default_model": {"type": "string"},
                        "models": {"type": "array", "items": {"type": "string"}},
                    },
                },
            },
            "default": {"type": "string"},
        },
    }
    items = {
        "type": "object",
        "required": ["items"],
        "properties": {"items": {"type": "array", "items": _ITEM}},
    }
    events = {
        "type": "object",
        "required": ["events", "last_sequence"],
        "properties": {
            "events": {"type": "array", "items": _EVENT},
            "last_sequence": {"type": "integer", "minimum": 0},
        },
    }
    paths: dict[str, Any] = {
        "/healthz": {"get": {"responses": _json("alive", _OBJ)}},
        "/readyz": {"get": {"responses": {**_json("ready", _OBJ), **_problems(503)}}},
        "/v1/engines": {"get": {"responses": {**_json("engines", engines), **_problems(401)}}},
        "/v1/threads": {
            "get": {
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                    {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {
                    **_json("a page of threads", {"$ref": "#/components/schemas/ThreadPage"}),
                    **_problems(400, 401, 503),
                },
            },
            "post": {
                "requestBody": _body(
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "thread_id": {"type": "string"},
                            "title": {"type": "string"},
                            "extra": _OBJ,
                        },
                    }
                ),
                "responses": {
                    **_json("created", _META, 201),
                    **_problems(400, 401, 409, 413, 422, 503),
                },
            },
        },
        "/v1/threads/{thread_id}": {
            "parameters": [_THREAD_ID],
            "get": {"responses": {**_json("metadata", _META), **_problems(*_COMMON)}},
            "patch": {
                "requestBody": _body(
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"title": {"type": ["string", "null"]}, "extra": _OBJ},
                    }
                ),
                "responses": {**_json("metadata", _META), **_problems(*_COMMON, 422)},
            },
            "delete": {
                "responses": {"204": {"description": "deleted"}, **_problems(*_COMMON, 409)}
            },
        },
        "/v1/threads/{thread_id}/items": {
            "parameters": [_THREAD_ID],
            "get": {
                "parameters": [
                    {"name": "view", "in": "query", "schema": {"enum": ["replay", "all"]}}
                ],
                "responses": {**_json("items", items), **_problems(*_COMMON)},
            },
        },
        "/v1/threads/{thread_id}/events": {
            "parameters": [_THREAD_ID],
            "get": {
                "parameters": [
                    {"name": "after", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                ],
                "responses": {**_json("events", events), **_problems(*_COMMON)},
            },
        },
        "/v1/threads/{thread_id}/stream": {
            "parameters": [_THREAD_ID],
            "get": {
                "parameters": [
                    {"name": "after", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "until", "in": "query", "schema": {"enum": ["turn_end"]}},
                    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": {
                        "description": "server-sent events: id, event, data per journal event",
                        # OpenAPI 3.1: the schema of a text/event-stream is one message's.
                        "content": {"text/event-stream": {"schema": _SSE_MESSAGE}},
                    },
                    **_problems(*_COMMON),
                },
            },
        },
        "/v1/threads/{thread_id}/runs": {
            "parameters": [_THREAD_ID],
            "post": {
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": run_body}},
                },
                "responses": {
                    **_json("accepted: the input is journaled", run_status, 202),
                    **_problems(*_COMMON, 409, 422, 429),
                },
            },
        },
        "/v1/threads/{thread_id}/runs/{turn_id}": {
            "parameters": [_THREAD_ID, _TURN_ID],
            "get": {"responses": {**_json("the run", run_status), **_problems(*_COMMON)}},
        },
        "/v1/threads/{thread_id}/runs/{turn_id}/interrupt": {
            "parameters": [_THREAD_ID, _TURN_ID],
            "post": {"responses": {**_json("interrupting", _OBJ, 202), **_problems(*_COMMON, 409)}},
        },
        "/v1/threads/{thread_id}/approvals/{call_id}": {
            "parameters": [_THREAD_ID, _CALL_ID],
            "post": {
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["approved"],
                                "additionalProperties": False,
                                "properties": {
                                    "approved": {"type": "boolean"},
                                    "reason": {"type": "string"},
                                },
                            }
                        }
                    },
                },
                "responses": {**_json("decided", _OBJ, 202), **_problems(*_COMMON, 409, 422)},
            },
        },
    }
    paths.update(openai_paths())
    return {
        "openapi": "3.1.0",
        "info": {"title": "roder serve", "version": __version__},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Problem": {
                    "type": "object",
                    "required": ["type", "title", "status", "detail", "error"],
                    "properties": {
                        "type": {"type": "string"},
                        "title": {"type": "string"},
                        "status": {"type": "integer"},
                        "detail": {"type": "string"},
                        "error": {"type": "string"},
                    },
                },
                "ThreadMetadata": {
                    "type": "object",
                    "required": ["type", "thread_id", "created_at_ms", "updated_at_ms"],
                    "properties": {
                        "type": {"const": "thread_metadata"},
                        "thread_id": {"type": "string"},
                        "created_at_ms": {"type": "integer"},
                        "updated_at_ms": {"type": "integer"},
                        "title": {"type": ["string", "null"]},
                        "usage": _USAGE,
                        "item_count": {"type": "integer"},
                        "last_sequence": {"type": "integer"},
                        "extra": _OBJ,
                        "open_turns": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "TokenUsage": {
                    "type": "object",
                    "required": ["type"],
                    "properties": {
                        "type": {"const": "token_usage"},
                        "prompt_tokens": {"type": "integer", "minimum": 0},
                        "completion_tokens": {"type": "integer", "minimum": 0},
                        "total_tokens": {"type": "integer", "minimum": 0},
                    },
                },
                "Item": {
                    "type": "object",
                    "description": "a transcript item, the codec's wire form",
                    "required": ["type"],
                    "properties": {
                        "type": {"enum": _ITEM_TYPES},
                        "text": {"type": "string"},
                        "id": {"type": "string"},
                        "name": {"type": "string"},
                    },
                },
                "JournalEvent": {
                    "type": "object",
                    "description": "one journal event, as `roder threads export` writes it",
                    "required": ["type", "sequence", "recorded_at_ms", "event"],
                    "properties": {
                        "type": {"const": "journal_event"},
                        "sequence": {"type": "integer", "minimum": 1},
                        "recorded_at_ms": {"type": "integer"},
                        "event": {
                            "type": "object",
                            "required": ["type"],
                            "properties": {
                                "type": {"enum": _EVENT_TYPES},
                                "turn_id": {"type": "string"},
                            },
                        },
                    },
                },
                **openai_schemas(),
                "ThreadPage": {
                    "type": "object",
                    "required": ["threads", "next_cursor"],
                    "properties": {
                        "threads": {"type": "array", "items": _META},
                        "next_cursor": {"type": ["string", "null"]},
                    },
                },
            },
        },
        "security": [{"bearer": []}],
    }
