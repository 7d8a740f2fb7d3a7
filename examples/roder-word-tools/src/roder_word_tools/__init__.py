"""A minimal tool plugin: ``word_count`` and ``top_words``, registered by ``register_tools``.

Copy it to start your own. Each tool is a plain function made into a ``Tool`` by the
``tool`` decorator: its type hints and docstring become the JSON Schema the model sees.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

from roder_api import hookimpl
from roder_api.tools import Tool, tool

WORD = re.compile(r"[\w']+")


@tool(idempotent=True)
def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: the text whose words to count
    """
    return len(WORD.findall(text))


@tool(idempotent=True)
def top_words(text: str, n: int = 3) -> list[list[object]]:
    """Return the most frequent words of a text, with their counts, most frequent first.

    Args:
        text: the text to look at (case is ignored)
        n: how many words to return
    """
    counts = Counter(word.lower() for word in WORD.findall(text))
    return [[word, count] for word, count in counts.most_common(max(n, 0))]


@hookimpl
def register_tools(register: Callable[[Tool], None]) -> None:
    """Register the two tools."""
    register(word_count)
    register(top_words)
