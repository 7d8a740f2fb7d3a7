"""The OpenAI-compatible surface of ``roder serve``: the Responses API over Roder's threads.

A conversation is a thread, a response is a turn (``resp_<turn id>``), and every stream
event is derived from the journal (:mod:`roder_server.openai._projection`), so a response
can be replayed and continued from any worker at any later time.
"""

from __future__ import annotations

from roder_server.openai._routes import ROUTES

__all__ = ["ROUTES"]
