"""Requests and objects of the Responses API, checked against the openai SDK's own types."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from openai.types import Model
from openai.types.conversations import ConversationItem

from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    UserMessage,
)
from roder_server.openai._convert import (
    ApprovalAnswer,
    FunctionOutput,
    OpenAIError,
    item_json,
    model_json,
    parse_input,
    split_model,
)


def test_input_as_a_string_or_items() -> None:
    assert parse_input("hi").text == "hi"
    parsed = parse_input(
        [
            {"role": "user", "content": "one"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two"}]},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"type": "mcp_approval_response", "approval_request_id": "mcpr_c2", "approve": False},
        ]
    )
    assert parsed.text == "one\n\ntwo"
    assert parsed.outputs == (FunctionOutput("c1", "42"),)
    assert parsed.approvals == (ApprovalAnswer("mcpr_c2", False),)


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ("", "input"),
        ([], "input"),
        (3, "input"),
        ([{"role": "assistant", "content": "x"}], "input[0].role"),
        ([{"role": "system", "content": "x"}], "input[0].role"),
        ([{"role": "user", "content": [{"type": "input_image"}]}], "input[0].content[0]"),
        ([{"type": "function_call_output", "call_id": "", "output": "x"}], "input[0].call_id"),
        ([{"type": "mcp_approval_response", "approve": "yes"}], "input[0]"),
        ([{"type": "web_search_call"}], "input[0].type"),
        (["text"], "input[0]"),
    ],
)
def test_bad_input_is_refused_naming_the_item(value: Any, param: str) -> None:
    with pytest.raises(OpenAIError) as raised:
        parse_input(value)
    assert raised.value.status == 400 and raised.value.param == param
    body = raised.value.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}


def test_model_names_an_engine_or_a_model_of_the_default_engine() -> None:
    engines = ["openai", "scripted"]
    assert split_model("openai/gpt-5-mini", engines, "scripted") == ("openai", "gpt-5-mini")
    assert split_model("scripted-1", engines, "scripted") == ("scripted", "scripted-1")
    # A slash that is not after an engine id belongs to the model (org/model ids).
    assert split_model("meta/llama-3", engines, "openai") == ("openai", "meta/llama-3")
    with pytest.raises(OpenAIError):
        split_model("openai/", engines, "scripted")
    with pytest.raises(OpenAIError):
        split_model(None, engines, "scripted")


def test_objects_parse_as_the_sdks_types() -> None:
    Model.model_validate(model_json("scripted", "scripted-1"))
    union = typing.get_args(typing.get_args(ConversationItem)[0])
    classes = {}
    for cls in union:
        annotation = cls.model_fields["type"].annotation
        for literal in typing.get_args(annotation):
            classes[literal] = cls
    items = [
        UserMessage("hi"),
        AssistantMessage("hello"),
        AssistantMessage("hel", interrupted=True),
        Reasoning("hmm"),
        ToolCallRecord("c1", "lookup", "{}"),
        ToolResultRecord("c1", "lookup", "ten"),
    ]
    for index, item in enumerate(items):
        data = item_json(item, f"item_{index}")
        assert data is not None
        classes[data["type"]].model_validate(data)
    assert item_json(ContextCompaction("summary"), "x") is None
