"""Thread ids as people type them: a whole id, or a unique prefix of one."""

from __future__ import annotations

from roder_api.errors import ThreadNotFoundError
from roder_runtime._runtime import Runtime
from roder_runtime.cli._common import EXIT_USAGE, CommandError
from roder_runtime.threads import all_threads

MATCHES_SHOWN = 10
"""How many matching ids an ambiguous prefix's error lists."""


async def resolve_thread_id(runtime: Runtime, text: str) -> str:
    """Return the id of the one thread whose id is ``text`` or starts with it.

    Raise ``ThreadNotFoundError`` (exit 1) when no thread matches and ``CommandError``
    (exit 2, a usage error) when several do, listing them.
    """
    wanted = text.strip()
    if not wanted:
        raise CommandError("a thread id cannot be empty", EXIT_USAGE)
    try:
        return (await runtime.get_thread(wanted)).thread_id
    except (ThreadNotFoundError, ValueError):
        pass
    matches = [meta for meta in await all_threads(runtime) if meta.thread_id.startswith(wanted)]
    if len(matches) == 1:
        return matches[0].thread_id
    if not matches:
        raise ThreadNotFoundError(wanted)
    shown = ", ".join(meta.thread_id for meta in matches[:MATCHES_SHOWN])
    more = f" and {len(matches) - MATCHES_SHOWN} more" if len(matches) > MATCHES_SHOWN else ""
    raise CommandError(
        f"{wanted!r} matches {len(matches)} threads: {shown}{more}; give more of the id",
        EXIT_USAGE,
    )


async def latest_thread_id(runtime: Runtime) -> str | None:
    """Return the id of the most recently updated thread, or None when there is none."""
    page = await runtime.list_threads(limit=1)
    return page.threads[0].thread_id if page.threads else None
