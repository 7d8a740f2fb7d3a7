"""The OpenAPI 3.1 document of the server (hand-written: the routes are few and fixed)."""

from __future__ import annotations

from typing import Any

from roder_api import __version__

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
            "usage": _OBJ,
        },
    }
    paths: dict[str, Any] = {
        "/healthz": {"get": {"responses": _json("alive", _OBJ)}},
        "/readyz": {"get": {"responses": {**_json("ready", _OBJ), **_problems(503)}}},
        "/v1/engines": {"get": {"responses": {**_json("engines", _OBJ), **_problems(401)}}},
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
                "responses": {**_json("items", _OBJ), **_problems(*_COMMON)},
            },
        },
        "/v1/threads/{thread_id}/events": {
            "parameters": [_THREAD_ID],
            "get": {
                "parameters": [
                    {"name": "after", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                ],
                "responses": {**_json("events", _OBJ), **_problems(*_COMMON)},
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
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
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
                        "usage": _OBJ,
                        "item_count": {"type": "integer"},
                        "last_sequence": {"type": "integer"},
                        "extra": _OBJ,
                        "open_turns": {"type": "array", "items": {"type": "string"}},
                    },
                },
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
