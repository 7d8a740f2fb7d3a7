"""``roder serve`` parses HTTP with httptools (a C parser), not uvicorn's pure-Python
fallback: the server's CPU per streamed event is what the persist-to-client tail is made
of on a loaded machine (benchmarks/README.md, serve_bench)."""

from __future__ import annotations

import uvicorn
from starlette.applications import Starlette


def test_uvicorn_picks_the_httptools_parser() -> None:
    config = uvicorn.Config(Starlette(), lifespan="off")
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"
