"""The OpenAI-compatible routes in the OpenAPI document: their paths and schemas.

What ``roder_server._openapi`` adds to the document it serves. Bodies are described as far
as the server checks them (unknown request fields are refused with 400, so they are not
in the schema); errors are the OpenAI error shape, never problem+json.
"""

from __future__ import annotations

from typing import Any

_ERROR = {"$ref": "#/components/schemas/OpenAIError"}
_RESPONSE = {"$ref": "#/components/schemas/OpenAIResponse"}
_CONVERSATION = {"$ref": "#/components/schemas/OpenAIConversation"}
_STRING = {"type": "string"}
_NULLABLE_STRING = {"type": ["string", "null"]}
_OBJECT: dict[str, Any] = {"type": "object"}


def _errors(*codes: int) -> dict[str, Any]:
    return {
        str(code): {
            "description": "an error in the OpenAI shape",
            "content": {"application/json": {"schema": _ERROR}},
        }
        for code in codes
    }


def _ok(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "200": {"description": description, "content": {"application/json": {"schema": schema}}}
    }


def _body(schema: dict[str, Any], required: bool = False) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": _STRING}


def _list_of(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["object", "data", "first_id", "last_id", "has_more"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": item},
            "first_id": _NULLABLE_STRING,
            "last_id": _NULLABLE_STRING,
            "has_more": {"type": "boolean"},
        },
    }


_COMMON = (400, 401, 404, 413, 503)
_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "type": {"const": "message"},
        "role": _STRING,
        "content": {"type": ["string", "array"]},
    },
}
_ITEM = {"$ref": "#/components/schemas/OpenAIItem"}
_EVENTS: dict[str, Any] = {"text/event-stream": {"schema": _STRING}}
"""The Responses API's server-sent events (with ``stream``)."""


def openai_paths() -> dict[str, Any]:
    """Return the paths of ``/v1/responses``, ``/v1/conversations`` and ``/v1/models``."""
    create = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "model": _STRING,
            "input": {"type": ["string", "array"]},
            "instructions": _NULLABLE_STRING,
            "conversation": {"type": ["string", "object"]},
            "previous_response_id": _NULLABLE_STRING,
            "tools": {"type": "array", "items": _OBJECT},
            "stream": {"type": "boolean"},
            "background": {"type": "boolean"},
            "store": {"type": "boolean"},
            "metadata": _OBJECT,
        },
    }
    response_id = [_path("response_id")]
    conversation_id = [_path("conversation_id")]
    conversation_body = {
        "type": "object",
        "properties": {"metadata": _OBJECT, "items": {"type": "array", "items": _MESSAGE}},
    }
    deleted = {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {"id": _STRING, "object": _STRING, "deleted": {"type": "boolean"}},
    }
    return {
        "/v1/responses": {
            "post": {
                "requestBody": _body(create, required=True),
                "responses": {
                    "200": {
                        "description": "the response (or, with 'stream', its events)",
                        "content": {
                            "application/json": {"schema": _RESPONSE},
                            **_EVENTS,
                        },
                    },
                    **_errors(*_COMMON, 409, 429),
                },
            }
        },
        "/v1/responses/{response_id}": {
            "parameters": response_id,
            "get": {
                "parameters": [
                    {"name": "stream", "in": "query", "schema": {"enum": ["true", "false"]}},
                    {"name": "starting_after", "in": "query", "schema": {"type": "integer"}},
                ],
                "responses": {
                    "200": {
                        "description": "the response (or, with stream=true, its events)",
                        "content": {
                            "application/json": {"schema": _RESPONSE},
                            **_EVENTS,
                        },
                    },
                    **_errors(*_COMMON),
                },
            },
            "delete": {"responses": {**_ok("deleted", deleted), **_errors(*_COMMON)}},
        },
        "/v1/responses/{response_id}/cancel": {
            "parameters": response_id,
            "post": {"responses": {**_ok("the response", _RESPONSE), **_errors(*_COMMON, 409)}},
        },
        "/v1/responses/{response_id}/input_items": {
            "parameters": response_id,
            "get": {"responses": {**_ok("its input items", _list_of(_ITEM)), **_errors(*_COMMON)}},
        },
        "/v1/conversations": {
            "post": {
                "requestBody": _body(conversation_body),
                "responses": {**_ok("created", _CONVERSATION), **_errors(*_COMMON)},
            }
        },
        "/v1/conversations/{conversation_id}": {
            "parameters": conversation_id,
            "get": {"responses": {**_ok("the conversation", _CONVERSATION), **_errors(*_COMMON)}},
            "post": {
                "requestBody": _body(
                    {
                        "type": "object",
                        "required": ["metadata"],
                        "properties": {"metadata": _OBJECT},
                    },
                    required=True,
                ),
                "responses": {**_ok("updated", _CONVERSATION), **_errors(*_COMMON)},
            },
            "delete": {"responses": {**_ok("deleted", deleted), **_errors(*_COMMON)}},
        },
        "/v1/conversations/{conversation_id}/items": {
            "parameters": conversation_id,
            "get": {
                "parameters": [
                    {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}}
                ],
                "responses": {**_ok("its items", _list_of(_ITEM)), **_errors(*_COMMON)},
            },
            "post": {
                "requestBody": _body(
                    {
                        "type": "object",
                        "required": ["items"],
                        "properties": {"items": {"type": "array", "items": _MESSAGE}},
                    },
                    required=True,
                ),
                "responses": {**_ok("the items added", _list_of(_ITEM)), **_errors(*_COMMON)},
            },
        },
        "/v1/models": {
            "get": {
                "responses": {
                    **_ok(
                        "every engine's models as ENGINE/MODEL",
                        _list_of_models(),
                    ),
                    **_errors(401),
                }
            }
        },
    }


def _list_of_models() -> dict[str, Any]:
    model = {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": _STRING,
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": _STRING,
        },
    }
    return {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": model}},
    }


def openai_schemas() -> dict[str, Any]:
    """Return the component schemas the OpenAI paths refer to."""
    return {
        "OpenAIError": {
            "type": "object",
            "required": ["error"],
            "additionalProperties": False,
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["message", "type", "param", "code"],
                    "properties": {
                        "message": _STRING,
                        "type": _STRING,
                        "param": _NULLABLE_STRING,
                        "code": _NULLABLE_STRING,
                    },
                }
            },
        },
        "OpenAIItem": {
            "type": "object",
            "required": ["id", "type"],
            "properties": {
                "id": _STRING,
                "type": {"enum": ["message", "reasoning", "function_call", "function_call_output"]},
                "role": {"enum": ["user", "assistant"]},
                "status": _STRING,
                "content": {"type": "array", "items": _OBJECT},
            },
        },
        "OpenAIResponse": {
            "type": "object",
            "required": ["id", "object", "created_at", "status", "model", "output"],
            "properties": {
                "id": _STRING,
                "object": {"const": "response"},
                "created_at": {"type": "number"},
                "status": {
                    "enum": [
                        "queued",
                        "in_progress",
                        "completed",
                        "incomplete",
                        "failed",
                        "cancelled",
                    ]
                },
                "model": _STRING,
                "instructions": _NULLABLE_STRING,
                "previous_response_id": _NULLABLE_STRING,
                "conversation": {"type": ["object", "null"]},
                "output": {"type": "array", "items": _OBJECT},
                "usage": {"type": ["object", "null"]},
                "error": {"type": ["object", "null"]},
                "metadata": _OBJECT,
            },
        },
        "OpenAIConversation": {
            "type": "object",
            "required": ["id", "object", "created_at", "metadata"],
            "properties": {
                "id": _STRING,
                "object": {"const": "conversation"},
                "created_at": {"type": "integer"},
                "metadata": _OBJECT,
            },
        },
    }
