"""A thread in the forms ``roder threads export`` writes: JSON lines (verbatim) and Markdown.

:func:`export_thread` reads through the Runtime (bounded by its store deadline) and returns
the text; the renderers are plain functions of what was read. Public through
:mod:`roder_runtime.threads`.
"""

from __future__ import annotations

import datetime as _dt
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from roder_api.codec import dumps as codec_dumps
from roder_api.errors import ThreadNotFoundError
from roder_api.events import JournalEvent
from roder_api.threads import ThreadMetadata, ThreadSnapshot
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
    is_compaction_boundary,
)
from roder_runtime.threads._thread_ops import read_journal

if TYPE_CHECKING:  # only for annotations: the runtime does not import this module
    from roder_runtime._runtime import Runtime


class ExportFormat(str, enum.Enum):
    """The forms of :func:`export_thread` (a ``str`` enum: it prints as its value)."""

    JSONL = "jsonl"
    """The metadata, then each journal event, one codec JSON object per line (verbatim)."""
    MARKDOWN = "markdown"
    """A heading, the metadata, and every turn's items, for people."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class ThreadExport:
    """A thread as :func:`export_thread` wrote it: the ``text`` and how many events it covers."""

    metadata: ThreadMetadata
    format: ExportFormat
    text: str
    events: int


async def export_thread(
    runtime: Runtime, thread_id: str, format: ExportFormat | str = ExportFormat.JSONL
) -> ThreadExport:
    """Return a thread exported as ``format`` (``jsonl`` or ``markdown``).

    A read (no lease): the JSON lines are the journal's events 1..N of the metadata read
    first (writers may go on), Markdown renders the snapshot's turns. Raise
    ``ThreadNotFoundError`` when the thread does not exist and ``ValueError`` for another
    format.
    """
    chosen = ExportFormat(format)
    if chosen is ExportFormat.JSONL:
        metadata, entries = await read_journal(runtime, thread_id)
        return ThreadExport(metadata, chosen, export_jsonl(metadata, entries), len(entries))
    snapshot = await runtime.load_thread(thread_id)
    if snapshot is None:
        raise ThreadNotFoundError(thread_id)
    metadata = snapshot.metadata
    return ThreadExport(metadata, chosen, export_markdown(snapshot), metadata.last_sequence)


def format_ms(ms: int) -> str:
    """Return a labelled UTC time for epoch milliseconds (``2026-01-31 12:00:00 UTC``)."""
    moment = _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def forked_from(meta: ThreadMetadata) -> Mapping[str, Any] | None:
    """Return a fork's ``forked_from`` (``thread_id``, ``sequence``), or None."""
    origin = meta.extra.get("forked_from") if isinstance(meta.extra, Mapping) else None
    return origin if isinstance(origin, Mapping) else None


def describe_item(item: TranscriptItem) -> str:
    """Return one readable line for a transcript item."""
    if isinstance(item, UserMessage):
        return f"you> {item.text}"
    if isinstance(item, AssistantMessage):
        mark = " [interrupted]" if item.interrupted else ""
        return f"assistant> {item.text}{mark}"
    if isinstance(item, Reasoning):
        return f"(reasoning) {item.text}"
    if isinstance(item, ToolCallRecord):
        return f"(tool call {item.id}) {item.name}({item.arguments})"
    if isinstance(item, ToolResultRecord):
        return f"(tool result {item.id}{' error' if item.is_error else ''}) {item.result}"
    if isinstance(item, ContextCompaction):
        return f"(compaction boundary) {item.summary}"
    if isinstance(item, ProviderMetadata):
        if is_compaction_boundary(item):
            kept = item.data.get("compacted_input")
            count = len(kept) if isinstance(kept, list) else 0
            return f"(native compaction boundary; replays {count} provider items first)"
        return "(provider data)"
    return repr(item)


def export_jsonl(meta: ThreadMetadata, entries: Sequence[JournalEvent]) -> str:
    """Return the JSON-lines export: the metadata, then each journal event, one per line."""
    lines = [codec_dumps(meta)]
    lines.extend(codec_dumps(entry) for entry in entries)
    return b"\n".join(lines).decode() + "\n"


def _fenced(text: str, lang: str = "") -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}{lang}\n{text}\n{fence}"


def export_markdown(snapshot: ThreadSnapshot) -> str:
    """Return the Markdown export: a heading, the metadata, and every turn's items."""
    meta = snapshot.metadata
    out = [f"# {meta.title or 'Thread ' + meta.thread_id}", ""]
    out.append(f"- thread: `{meta.thread_id}`")
    out.append(f"- created: {format_ms(meta.created_at_ms)}")
    out.append(f"- updated: {format_ms(meta.updated_at_ms)}")
    out.append(f"- items: {meta.item_count}; tokens: {meta.usage.total_tokens}")
    origin = forked_from(meta)
    if origin is not None:
        out.append(
            f"- forked from: `{origin.get('thread_id')}` at sequence {origin.get('sequence')}"
        )
    for number, turn in enumerate(snapshot.turns, start=1):
        out += ["", f"## Turn {number}", ""]
        for item in turn.items:
            out += [_markdown_item(item), ""]
        out.pop()
    return "\n".join(out) + "\n"


def _markdown_item(item: TranscriptItem) -> str:
    if isinstance(item, UserMessage):
        return f"**You:**\n\n{item.text}"
    if isinstance(item, AssistantMessage):
        mark = " *(interrupted)*" if item.interrupted else ""
        return f"**Assistant:**{mark}\n\n{item.text}"
    if isinstance(item, Reasoning):
        quoted = "\n".join(f"> {line}" for line in item.text.splitlines() or [""])
        return f"*Reasoning:*\n\n{quoted}"
    if isinstance(item, ToolCallRecord):
        return f"**Tool call** `{item.name}` (`{item.id}`):\n\n{_fenced(item.arguments, 'json')}"
    if isinstance(item, ToolResultRecord):
        label = "Tool error" if item.is_error else "Tool result"
        return f"**{label}** `{item.name}` (`{item.id}`):\n\n{_fenced(item.result)}"
    if isinstance(item, ContextCompaction):
        return f"---\n\n*Compaction summary:*\n\n{item.summary}\n\n---"
    return f"*{describe_item(item)}*"
