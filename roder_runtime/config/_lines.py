"""Where each key of a TOML file was written: one pass over the text, by table and key."""

from __future__ import annotations

import re

NESTED_DEPTH = 8
"""How many tables deep inside a plugin's table the lines of keys are recorded."""

_KEY_PART = r'(?:"[^"]*"|[A-Za-z0-9_-]+)'
_HEADER = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]")
_KEYED = re.compile(rf"^\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")
_PARTS = re.compile(r'"([^"]*)"|([A-Za-z0-9_-]+)')


def line_index(text: str) -> dict[tuple[str | None, str], int]:
    """Return the first line of every ``key =`` by table (and of every header, key "").

    A dotted key (``models.m.temperature = 1`` in ``[engines.x]``) is indexed under the
    table it lands in (``engines.x.models.m``) and each of its parent tables.
    """
    index: dict[tuple[str | None, str], int] = {}
    current: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = _HEADER.match(line)
        if match:
            current = ".".join(q if q else bare for q, bare in _PARTS.findall(match.group(1)))
            index.setdefault((current, ""), number)
            continue
        match = _KEYED.match(line)
        if match:
            parts = [q if q else bare for q, bare in _PARTS.findall(match.group(1))]
            table = current
            for part in parts[: NESTED_DEPTH + 2]:  # [engines.<id>] and its tables
                index.setdefault((table, part), number)
                table = f"{table}.{part}" if table else part
    return index
