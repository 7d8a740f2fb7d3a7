"""A loopback Chat Completions server (the wire format of Ollama, vLLM, llama.cpp, LM Studio).

It answers every ``POST /v1/chat/completions`` with a streamed reply that names the server,
lists ``GET /v1/models``, and keeps the JSON bodies it was sent.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ChatServer:
    """A Chat Completions server on 127.0.0.1 in a thread; ``with ChatServer("a") as s:``."""

    def __init__(self, name: str, models: tuple[str, ...] = ("local-model",)) -> None:
        self.name = name
        self.models = models
        self.bodies: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path != "/v1/models":
                    self.send_error(404)
                    return
                body = json.dumps({"data": [{"id": m, "object": "model"} for m in server.models]})
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                request = json.loads(self.rfile.read(length) or b"{}")
                server.bodies.append(request)
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                text = f"{server.name} says hi"
                for chunk in (
                    {"delta": {"role": "assistant", "content": ""}, "finish_reason": None},
                    {"delta": {"content": text}, "finish_reason": None},
                    {"delta": {}, "finish_reason": "stop"},
                ):
                    self._event(
                        {
                            "id": "c1",
                            "model": request.get("model"),
                            "choices": [{"index": 0, "logprobs": None, **chunk}],
                        }
                    )
                self._event(
                    {
                        "id": "c1",
                        "choices": [],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
                    }
                )
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _event(self, data: dict[str, Any]) -> None:
                self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
                self.wfile.flush()

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Return the base URL (``http://127.0.0.1:PORT/v1``)."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
