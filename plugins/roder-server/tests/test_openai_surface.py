"""The OpenAI surface's finer points against a real ``roder serve``: conversation items
added by the client, and errors in the OpenAI shape (also from the auth and body-size guard,
which answer before any route: checked by the raw body, the SDK raises by status alone)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from serve_support import Server, sdk

pytestmark = pytest.mark.slow

MODEL = "scripted/scripted-1"


def texts(items: Any) -> list[tuple[str, str]]:
    return [(item.role, "".join(part.text for part in item.content)) for item in items]


def test_items_added_to_a_conversation_are_kept_and_seen_by_the_model(
    serve: Callable[..., Server],
) -> None:
    server = serve()
    client = sdk(server)
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "remember forty two"}]
    )
    added = client.conversations.items.create(
        conversation.id,
        items=[
            {"type": "message", "role": "assistant", "content": "noted: forty two"},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "and seven"}],
            },
        ],
    )
    assert texts(added.data) == [("assistant", "noted: forty two"), ("user", "and seven")]
    listed = client.conversations.items.list(conversation.id)
    assert texts(listed.data) == [
        ("user", "remember forty two"),
        ("assistant", "noted: forty two"),
        ("user", "and seven"),
    ]
    assert [i.id for i in listed.data][1:] == [i.id for i in added.data]

    # The model's request holds the added items: the scripted engine bills the words of
    # the whole transcript, so the same input costs more prompt tokens in this
    # conversation than in an empty one.
    here = client.responses.create(model=MODEL, input="which?", conversation=conversation.id)
    alone = client.responses.create(model=MODEL, input="which?")
    assert here.output_text == alone.output_text == "You said: which?"
    assert here.usage is not None and alone.usage is not None
    assert here.usage.input_tokens > alone.usage.input_tokens

    with pytest.raises(openai.BadRequestError):
        client.conversations.items.create(
            conversation.id, items=[{"type": "message", "role": "system", "content": "no"}]
        )
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.create(
            "no-such-conversation", items=[{"type": "message", "role": "user", "content": "x"}]
        )
    assert len(client.conversations.items.list(conversation.id).data) == 5  # + the response


def _openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


def test_401_and_413_on_the_openai_routes_are_in_the_openai_shape(
    serve: Callable[..., Server],
) -> None:
    server = serve(
        env={"RODER_SERVER_TOKENS": "tok-1"}, extra_config="[server]\nmax_body_bytes = 2000\n"
    )
    big = {"model": MODEL, "input": "x" * 3000}
    with server.client() as c:
        for method, path in (
            ("POST", "/v1/responses"),
            ("GET", "/v1/conversations/abc"),
            ("GET", "/v1/models"),
        ):
            error = _openai_error(c.request(method, path), 401)
            assert error["code"] == "invalid_api_key"
        wrong = c.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        assert _openai_error(wrong, 401)["type"] == "invalid_request_error"
        assert wrong.headers["www-authenticate"] == "Bearer"
        # The core routes keep problem+json.
        core = c.get("/v1/threads")
        assert core.status_code == 401
        assert core.headers["content-type"].startswith("application/problem+json")
    with server.client("tok-1") as c:
        error = _openai_error(c.post("/v1/responses", json=big), 413)
        assert error["code"] == "request_too_large"
        conversation = c.post("/v1/conversations", json={}).json()["id"]
        items = {"items": [{"type": "message", "role": "user", "content": "y" * 3000}]}
        _openai_error(c.post(f"/v1/conversations/{conversation}/items", json=items), 413)

        # A body that grows over the limit without announcing its length (chunked).
        def chunks() -> Any:
            yield b'{"model": "scripted/scripted-1", "input": "'
            for _ in range(10):
                yield b"z" * 500
            yield b'"}'

        streamed = c.post(
            "/v1/responses", content=chunks(), headers={"Content-Type": "application/json"}
        )
        _openai_error(streamed, 413)
        core = c.post("/v1/threads", json={"title": "t" * 3000})
        assert core.status_code == 413
        assert core.headers["content-type"].startswith("application/problem+json")
        assert c.get(f"/v1/conversations/{conversation}/items").json()["data"] == []
