"""The SSE stream of a thread: the journal from a sequence on, then live, then keepalives.

Everything sent is journaled first (persist before deliver, end to end). A stream reads
the events after the last sequence it sent from the store, then follows the appends this
process makes: each append's entries are handed to the thread's streams in memory when
it is durable (``AppendWakeups.listen``), encoded as SSE once for all of them, so a live
event costs no store read per stream. Any gap (a sequence that does not follow the last
one sent), an append whose entries were not handed over, an overflow of a slow stream's
queue, or an append by another process (a gap at the next append here, or found by
``ThreadStore.wait_for_events``: a poll or ``LISTEN/NOTIFY``, which a stream asks only once
the thread has been quiet here for :data:`LOCAL_S`) sends the stream back to the store.
Given a task group (the app's), a stream runs that store wait in a task of it and takes a
hand-over at once, without waiting for the store read in flight (a poll queued behind many
session starts held the first events of a burst of runs for tens of ms).
What is ready goes out as one write. Sequences are strictly increasing with no gap: a
reconnect with ``Last-Event-ID: N`` (or ``?after=N``) continues at ``N + 1`` from any
process. A ``: keepalive`` comment goes out each time a wait (bounded by ``heartbeat_s``)
ends with nothing new.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import orjson

from roder_api.codec import to_dict
from roder_api.events import JournalEvent, TurnAborted, TurnComplete
from roder_api.threads import ThreadStore

_PAGE = 512
"""How many journal events one read of a stream takes."""

QUEUE_LIMIT = 2048
"""How many live events a stream holds for its client; past it the oldest go and the
stream reads them back from the store (a slow client never holds the process's memory)."""


def sse_message(entry: JournalEvent) -> bytes:
    """Return one SSE message: ``id:`` the sequence, ``event:`` the type, ``data:`` the JSON."""
    data = orjson.dumps(to_dict(entry))
    kind = entry.event.TYPE.encode()
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (entry.sequence, kind, data)


class _Live:
    """One appended entry, its SSE message encoded once for every stream that sends it."""

    __slots__ = ("_message", "entry")

    def __init__(self, entry: JournalEvent) -> None:
        self.entry = entry
        self._message: bytes | None = None

    @property
    def message(self) -> bytes:
        if self._message is None:
            self._message = sse_message(self.entry)
        return self._message


LOCAL_S = 0.25
"""How long after an append here a stream waits for the next one to be handed over, without
asking the store (``wait_for_events``: a store call per wake). Another process's append to
a thread busy here shows as a gap at the next append here, or is read within this long."""


class _Feed:
    """What one stream is handed: live entries in append order, or ``stale`` (read the
    store: entries were not handed over or dropped); ``wake`` set at each hand-over,
    ``local_at`` the time of the last."""

    __slots__ = ("local_at", "queue", "stale", "wake")

    def __init__(self) -> None:
        self.queue: deque[_Live] = deque(maxlen=QUEUE_LIMIT)
        self.stale = False
        self.wake = anyio.Event()
        self.local_at = -LOCAL_S


class _Fanout:
    """The feeds of one store's threads (one ``listen`` per thread and event loop)."""

    def __init__(self) -> None:
        self.feeds: dict[tuple[str, object], set[_Feed]] = {}
        self.forget: dict[tuple[str, object], Callable[[], None]] = {}


_FANOUTS: weakref.WeakKeyDictionary[Any, _Fanout] = weakref.WeakKeyDictionary()
"""The fan-out of each store's appends, by the store's ``append_wakeups``."""


@contextmanager
def _subscribe(store: ThreadStore, thread_id: str) -> Iterator[_Feed]:
    wakeups = store.append_wakeups
    fanout = _FANOUTS.get(wakeups)
    if fanout is None:
        fanout = _FANOUTS[wakeups] = _Fanout()
    key = (thread_id, anyio.lowlevel.current_token())
    feed = _Feed()
    feeds = fanout.feeds.get(key)
    if feeds is None:
        feeds = fanout.feeds[key] = set()

        def deliver(entries: Sequence[JournalEvent]) -> None:
            live = [_Live(entry) for entry in entries]
            now = anyio.current_time()
            for each in feeds:
                if live:
                    each.queue.extend(live)
                else:
                    each.stale = True
                each.local_at = now
                each.wake.set()

        fanout.forget[key] = wakeups.listen(thread_id, deliver)
    feeds.add(feed)
    try:
        yield feed
    finally:
        feeds.discard(feed)
        if not feeds:
            del fanout.feeds[key]
            fanout.forget.pop(key)()


async def journal_stream(
    store: ThreadStore,
    thread_id: str,
    after: int,
    *,
    heartbeat_s: float,
    until_turn_end: bool = False,
    task_group: anyio.abc.TaskGroup | None = None,
    known_last: int | None = None,
) -> AsyncIterator[bytes]:
    """Yield the SSE messages of every event after ``after``, then live ones, forever (or
    until the first turn end sent, with ``until_turn_end``).

    ``task_group`` (one that outlives the stream, such as the app's): the store's
    ``wait_for_events`` runs in a task of it, so that an append handed over meanwhile is
    sent at once (the wait is then cancelled; a store read it had begun ends in the
    background). Without it the stream awaits ``wait_for_events`` itself.

    ``known_last``: the thread's last sequence as the caller read it just before (the
    route's existence check). At or below ``after`` there is nothing to read yet: the
    stream skips its first store read and waits at once (an append since is handed over,
    or found by the store wait, which reads the last sequence again after subscribing)."""
    yield b"retry: 1000\n\n"
    # Subscribed before the first read: whatever commits after it is handed over.
    with _subscribe(store, thread_id) as feed:
        read = known_last is None or known_last > after
        while True:
            batch: list[bytes] = []  # what is ready goes out as one write
            ended = False
            if read:
                feed.queue.clear()  # the read covers all of it
                feed.stale = False
                entries = await store.read_events(thread_id, after=after, limit=_PAGE)
                for entry in entries:
                    if entry.sequence != after + 1:
                        break  # never skip: read again from the last sequence sent
                    after = entry.sequence
                    batch.append(sse_message(entry))
                    if until_turn_end and isinstance(entry.event, (TurnComplete, TurnAborted)):
                        ended = True
                        break
                read = len(entries) >= _PAGE and not ended
            while feed.queue and not feed.stale and not read and not ended:
                live = feed.queue.popleft()
                sequence = live.entry.sequence
                if sequence <= after:
                    continue  # the read had it
                if sequence != after + 1:
                    read = True  # a gap (another process's append, an overflow): read it
                    break
                after = sequence
                batch.append(live.message)
                if until_turn_end and isinstance(live.entry.event, (TurnComplete, TurnAborted)):
                    ended = True
            if batch:
                yield b"".join(batch)
            if ended:
                return
            if read or feed.stale:
                read = True
                continue
            if feed.queue:
                continue  # handed over while the batch was written
            if anyio.current_time() - feed.local_at < LOCAL_S:
                # Busy here: the next append is handed over; no store call per event.
                feed.wake = anyio.Event()
                with anyio.move_on_after(LOCAL_S):
                    await feed.wake.wait()
                continue
            last = None
            if task_group is not None:
                last = await _store_wait(task_group, store, feed, thread_id, after, heartbeat_s)
                if last is None and (feed.queue or feed.stale):
                    continue  # handed over before the store answered
            if last is None:
                # No task group, or the wait got no answer in time (or could not start).
                last = await store.wait_for_events(thread_id, after, heartbeat_s)
            if feed.queue or feed.stale:
                continue  # handed over meanwhile (the append that woke the wait)
            if last > after:
                read = True  # not appended here: another process, or no entries said
            else:
                yield b": keepalive\n\n"


_ANSWER_GRACE_S = 5.0
"""How long past ``heartbeat_s`` a stream waits for the store's answer before it asks the
store itself (a store slower than that is waited for in the stream, as without a group)."""


async def _store_wait(
    task_group: anyio.abc.TaskGroup,
    store: ThreadStore,
    feed: _Feed,
    thread_id: str,
    after: int,
    heartbeat_s: float,
) -> int | None:
    """Return ``store.wait_for_events(thread_id, after, heartbeat_s)`` run in a task of
    ``task_group``, or None once an append is handed over first (or no answer came)."""
    wake = feed.wake = anyio.Event()  # set by a hand-over, or by the task once it ends
    answer: list[int | BaseException] = []
    scope = anyio.CancelScope()

    async def ask() -> None:
        try:
            with scope:
                answer.append(await store.wait_for_events(thread_id, after, heartbeat_s))
        except Exception as exc:  # noqa: BLE001 - raised in the stream below
            answer.append(exc)
        finally:
            wake.set()

    try:
        task_group.start_soon(ask)
    except RuntimeError:
        return None  # the group is closed (the app is stopping): the stream asks itself
    try:
        with anyio.move_on_after(heartbeat_s + _ANSWER_GRACE_S):
            await wake.wait()
    finally:
        scope.cancel()  # handed over first: a read begun ends in the background, unread
    if not answer:
        return None
    found = answer[0]
    if isinstance(found, BaseException):
        raise found
    return found
