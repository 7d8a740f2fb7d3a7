"""Requests and objects of the Responses API, to and from Roder's types.

What a ``POST /v1/responses`` body asks for (:func:`parse_input`, :func:`split_model`),
how a thread's transcript items look as conversation items and input items
(:func:`item_json`), models as ``/v1/models`` lists them (:func:`model_json`), and errors
in the OpenAI shape (:class:`OpenAIError`, ``{"error": {"message", "type", "param",
"code"}}``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from roder_api.transcript import (
    AssistantMessage,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
)


class OpenAIError(Exception):
    """Raised to answer a request with an error in the OpenAI shape.

    ``status``: the HTTP status; ``kind``: the error ``type`` (``invalid_request_error``,
    ``not_found_error``, ...); ``param``: the request field at fault; ``code``: a short code.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """Return the JSON body of the error answer."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    """Return a 400 ``invalid_request_error`` about ``param``."""
    return OpenAIError(400, message, param=param, code="invalid_value" if param else None)


def not_found(message: str, param: str | None = None) -> OpenAIError:
    """Return a 404 ``not_found_error``."""
    return OpenAIError(404, message, kind="not_found_error", param=param, code="not_found")


@dataclass(frozen=True, slots=True)
class FunctionOutput:
    """A ``function_call_output`` input item: the client's result for one of its calls."""

    call_id: str
    output: str


@dataclass(frozen=True, slots=True)
class ApprovalAnswer:
    """An ``mcp_approval_response`` input item: approve or deny one of Roder's tool calls."""

    approval_request_id: str
    approve: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedInput:
    """What a request's ``input`` holds: user text, function outputs, approval answers."""

    text: str | None = None
    outputs: tuple[FunctionOutput, ...] = ()
    approvals: tuple[ApprovalAnswer, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


def _content_text(content: Any, param: str) -> str:
    """Return the text of a message's ``content`` (a string or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for index, part in enumerate(content):
            where = f"{param}[{index}]"
            kinds = ("input_text", "output_text", "text")
            if not isinstance(part, Mapping) or part.get("type") not in kinds:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise bad_request(f"content part of type {kind!r} is not supported", where)
            text = part.get("text")
            if not isinstance(text, str):
                raise bad_request("a text part needs a string 'text'", f"{where}.text")
            texts.append(text)
        return "".join(texts)
    raise bad_request("'content' must be a string or a list of input_text parts", param)


def parse_input(value: Any) -> ParsedInput:
    """Return what ``input`` asks for, or raise :class:`OpenAIError` (400) naming the item.

    ``input`` is a string (one user message) or a list of items: user messages (``{"role":
    "user", "content": ...}``, with or without ``"type": "message"``), ``function_call_output``
    items (the client's results of its function calls) and ``mcp_approval_response`` items
    (answers to Roder's approval requests). Several user messages are joined by a blank line.
    History is the conversation's: assistant, system and developer messages are refused
    (``instructions`` carries the system prompt).
    """
    if isinstance(value, str):
        if not value:
            raise bad_request("'input' must not be empty", "input")
        return ParsedInput(text=value)
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty list of items", "input")
    texts: list[str] = []
    outputs: list[FunctionOutput] = []
    approvals: list[ApprovalAnswer] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, Mapping):
            raise bad_request("an input item must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role != "user":
                raise bad_request(
                    f"a {role!r} message cannot be sent as input: the conversation holds the "
                    "history (use 'instructions' for a system prompt)",
                    f"{where}.role",
                )
            texts.append(_content_text(item.get("content"), f"{where}.content"))
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not call_id:
                raise bad_request("'call_id' must be a non-empty string", f"{where}.call_id")
            if not isinstance(output, str):
                output = _content_text(output, f"{where}.output")
            outputs.append(FunctionOutput(call_id, output))
        elif kind == "mcp_approval_response":
            request_id, approve = item.get("approval_request_id"), item.get("approve")
            if not isinstance(request_id, str) or not isinstance(approve, bool):
                raise bad_request(
                    "'approval_request_id' (a string) and 'approve' (a boolean) are required",
                    where,
                )
            reason = item.get("reason")
            approvals.append(
                ApprovalAnswer(request_id, approve, reason if isinstance(reason, str) else None)
            )
        else:
            raise bad_request(f"input items of type {kind!r} are not supported", f"{where}.type")
    text = "\n\n".join(texts) if texts else None
    return ParsedInput(text=text, outputs=tuple(outputs), approvals=tuple(approvals))


def message_items(value: Any, param: str = "items") -> list[TranscriptItem]:
    """Return the transcript items of a conversation's new ``items`` (user and assistant
    messages, content a string or text parts), or raise :class:`OpenAIError` naming one."""
    if not isinstance(value, list) or not value:
        raise bad_request(f"'{param}' must be a non-empty list of message items", param)
    items: list[TranscriptItem] = []
    for index, item in enumerate(value):
        where = f"{param}[{index}]"
        if not isinstance(item, Mapping) or item.get("type", "message") != "message":
            raise bad_request("only 'message' items can be added", where)
        text = _content_text(item.get("content"), f"{where}.content")
        role = item.get("role")
        if role == "user":
            items.append(UserMessage(text))
        elif role == "assistant":
            items.append(AssistantMessage(text))
        else:
            raise bad_request(
                f"a {role!r} message cannot be added: only 'user' and 'assistant' messages",
                f"{where}.role",
            )
    return items


def split_model(model: Any, engines: Sequence[str], default_engine: str) -> tuple[str, str]:
    """Return ``(engine id, model id)`` for a request's ``model``.

    ``ENGINE/MODEL`` names both (the engine must exist); anything else is a model of the
    default engine (model ids may hold slashes of their own: only a known engine id before
    the first slash counts as one).
    """
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a non-empty string", "model")
    engine, slash, rest = model.partition("/")
    if slash and engine in engines:
        if not rest:
            raise bad_request(f"'model' {model!r} names engine {engine!r} but no model", "model")
        return engine, rest
    return default_engine, model


def model_json(engine: str, model: str, created: int = 0) -> dict[str, Any]:
    """Return one entry of ``GET /v1/models``: ``ENGINE/MODEL``, owned by the engine."""
    return {"id": f"{engine}/{model}", "object": "model", "created": created, "owned_by": engine}


def item_json(item: TranscriptItem, item_id: str) -> dict[str, Any] | None:
    """Return a transcript item as a conversation item, or None when it has no such form.

    User and assistant messages, reasoning, tool calls (``function_call``) and results
    (``function_call_output``) have one; compaction boundaries and provider metadata do not.
    """
    if isinstance(item, UserMessage):
        return {
            "id": item_id,
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_text", "text": item.text}],
        }
    if isinstance(item, AssistantMessage):
        return {
            "id": item_id,
            "type": "message",
            "role": "assistant",
            "status": "incomplete" if item.interrupted else "completed",
            "content": [{"type": "output_text", "text": item.text, "annotations": []}],
        }
    if isinstance(item, Reasoning):
        return {
            "id": item_id,
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": item.text}],
        }
    if isinstance(item, ToolCallRecord):
        return {
            "id": item_id,
            "type": "function_call",
            "call_id": item.id,
            "name": item.name,
            "arguments": item.arguments,
            "status": "completed",
        }
    if isinstance(item, ToolResultRecord):
        return {
            "id": item_id,
            "type": "function_call_output",
            "call_id": item.id,
            "output": item.result,
            "status": "completed",
        }
    return None
