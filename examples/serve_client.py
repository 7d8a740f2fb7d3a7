"""A client of ``roder serve``: create a thread, start a run, stream it, resume after a drop.

    roder serve --port 0            # prints: roder serve: listening on http://127.0.0.1:PORT
    python examples/serve_client.py http://127.0.0.1:PORT "hello there"

It reads the stream until the turn ends, dropping the connection once on purpose half way
and reconnecting with ``Last-Event-ID``: the events arrive once each, in order. Set
``RODER_SERVER_TOKEN`` when the server wants a bearer token.
"""

from __future__ import annotations

import json
import os
import sys

import httpx


def stream(client: httpx.Client, thread_id: str, last_id: int, stop_after: int | None) -> int:
    """Print the events after ``last_id`` until the turn ends (or ``stop_after`` events);
    return the last id seen."""
    headers = {"Last-Event-ID": str(last_id)}
    seen = 0
    with client.stream(
        "GET", f"/v1/threads/{thread_id}/stream?until=turn_end", headers=headers
    ) as response:
        response.raise_for_status()
        event_id, kind = last_id, ""
        for line in response.iter_lines():
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                event = json.loads(line[6:])["event"]
                if kind == "assistant_content_delta":
                    print(event["delta"], end="", flush=True)
                elif kind in ("turn_complete", "turn_aborted"):
                    print(f"\n[{kind}] (last event id {event_id})")
                seen += 1
                if stop_after is not None and seen >= stop_after:
                    break
    return event_id


def main(base_url: str, text: str) -> int:
    """Run one turn on a new thread and print its reply as it streams."""
    token = os.environ.get("RODER_SERVER_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
        thread_id = client.post("/v1/threads", json={"title": "example"}).json()["thread_id"]
        run = client.post(f"/v1/threads/{thread_id}/runs", json={"input": text}).json()
        print(f"thread {thread_id}, run {run['turn_id']} ({run['status']})")
        last = stream(client, thread_id, 0, stop_after=3)  # drop the connection on purpose
        last = stream(client, thread_id, last, stop_after=None)  # resume where it left off
        status = client.get(f"/v1/threads/{thread_id}/runs/{run['turn_id']}").json()
        print(f"status: {status['status']}, tokens: {status['usage']['total_tokens']}")
        return 0 if status["status"] == "completed" else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: serve_client.py BASE_URL TEXT", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
