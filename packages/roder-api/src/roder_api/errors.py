"""The one error tree of Roder.

Every error Roder raises on purpose is a :class:`RoderError`::

    RoderError
    ├── PluginError
    │   ├── PluginLoadError            a plugin failed to import or raised in a hook
    │   ├── DuplicateRegistrationError two registrations share an id
    │   ├── MisconfiguredPluginError (LookupError)  installed, but its settings are bad
    │   └── UnknownPluginIdError (LookupError)
    │       ├── UnknownEngineError
    │       ├── UnknownThreadStoreError
    │       └── UnknownToolError
    ├── ConfigError (ValueError)       bad TOML, unknown key, bad value
    │   └── PluginSettingsError        a bad key or value in a plugin's own table
    ├── StoreError
    │   ├── ThreadNotFoundError (LookupError)
    │   ├── ThreadExistsError
    │   ├── InvalidThreadIdError (ValueError)
    │   ├── StoreCorruptedError
    │   ├── SequenceConflictError      the journal moved on: a conditional append or an
    │   │                              import did not continue it
    │   └── UnserializableEventError (TypeError)
    ├── CompactionError
    │   ├── CompactionFailed           the candidate boundary was discarded
    │   └── CompactionPreempted        the user steered while compacting
    ├── BusyError                      a bounded resource is taken: try again later
    │   ├── ThreadBusyError            another session holds the thread's lease
    │   └── RecorderFullError (RecorderError)  the recorder's queue is full
    ├── InputTooLargeError (ValueError)
    ├── ToolCallNotOpenError (ValueError)  a tool result as input answers no open call
    ├── RecorderError                  the event recorder refused or failed
    ├── StoppedError                   the component was closed or stopped
    └── ProviderFailure                a provider call failed (``.kind``, ``.retryable``,
                                       ``.retry_after``); in ``roder_api.inference``

Errors carry their context as attributes (``thread_id``, ``plugin``, ...) and say what to do
next in their message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for annotations: those modules import this one
    from roder_api.inference import TokenUsage
    from roder_api.threads import LeaseHolder


class RoderError(Exception):
    """Raised for every failure Roder reports on purpose; the base of the tree."""


class PluginError(RoderError):
    """Raised for problems with plugins and registrations."""


class PluginLoadError(PluginError):
    """Raised (or reported) when a plugin fails to import or raises in a hook."""

    def __init__(self, plugin: str, error: BaseException | str) -> None:
        self.plugin = plugin
        self.error = error
        detail = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        super().__init__(
            f"plugin {plugin!r} failed to load: {detail}. "
            "Fix or uninstall the plugin, or leave it out with RODER_PLUGINS."
        )


class DuplicateRegistrationError(PluginError):
    """Raised when two registrations of the same kind share an id."""

    def __init__(self, kind: str, id: str, first_source: str, second_source: str) -> None:
        self.kind = kind
        self.id = id
        self.first_source = first_source
        self.second_source = second_source
        super().__init__(
            f"{kind} id {id!r} is registered twice: by {first_source} and by {second_source}. "
            "Uninstall one of them or leave one out with RODER_PLUGINS."
        )


class UnknownPluginIdError(PluginError, LookupError):
    """Raised when an id names nothing registered."""

    kind = "plugin"

    def __init__(self, id: str, known: Iterable[str]) -> None:
        self.id = id
        self.known = tuple(sorted(known))
        listed = ", ".join(repr(k) for k in self.known) or "none"
        super().__init__(
            f"unknown {self.kind} id {id!r}; registered ids: {listed}. "
            "Check the spelling or install the plugin that provides it."
        )


class UnknownEngineError(UnknownPluginIdError):
    """Raised when no inference engine has the requested id."""

    kind = "inference engine"


class UnknownThreadStoreError(UnknownPluginIdError):
    """Raised when no thread-store factory has the requested id."""

    kind = "thread store"


class UnknownToolError(UnknownPluginIdError):
    """Raised when no tool has the requested name."""

    kind = "tool"


class ConfigError(RoderError, ValueError):
    """Raised for bad configuration: unparsable TOML, an unknown key or a bad value."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        key: str | None = None,
        line: int | None = None,
    ) -> None:
        self.source = source
        self.key = key
        self.line = line
        where = ""
        if source is not None:
            where = source + (f":{line}" if line is not None else "")
            where += ": "
        super().__init__(where + message)


class PluginSettingsError(ConfigError):
    """Raised by a plugin for a bad key or value in the settings table meant for it.

    ``settings_id`` is the engine or store id the table belongs to (the key of the hooks'
    ``settings`` mapping) and ``setting`` the key inside it (None: the table as a whole).
    The registry adds where the key was written (file and line) and reports the id as
    misconfigured rather than unknown.
    """

    def __init__(
        self,
        settings_id: str,
        setting: str | None,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
    ) -> None:
        self.settings_id = settings_id
        self.setting = setting
        self.reason = message
        super().__init__(message, source=source, key=setting, line=line)


class MisconfiguredPluginError(PluginError, LookupError):
    """Raised when an id belongs to an installed plugin that its settings keep from working."""

    def __init__(self, kind: str, id: str, plugin: str, reason: str) -> None:
        self.kind = kind
        self.id = id
        self.plugin = plugin
        self.reason = reason
        super().__init__(
            f"{kind} {id!r} (plugin {plugin!r}) is installed but misconfigured: {reason}"
        )


def check_settings(settings_id: str, table: Mapping[str, Any] | None, known: Iterable[str]) -> None:
    """Raise ``PluginSettingsError`` for the first key of ``table`` not in ``known``.

    For plugins that validate their settings table: an unknown key is usually a typo that
    would otherwise be silently ignored.
    """
    allowed = frozenset(known)
    for key in table or {}:
        if key not in allowed:
            raise PluginSettingsError(
                settings_id,
                key,
                f"unknown key {key!r}; known keys: {', '.join(sorted(allowed))}",
            )


class StoreError(RoderError):
    """Raised for thread-store failures."""


class ThreadNotFoundError(StoreError, LookupError):
    """Raised when a thread does not exist in the store."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(
            f"thread {thread_id!r} was not found; list threads with `roder threads list`."
        )


class ThreadExistsError(StoreError):
    """Raised when creating a thread whose id is already taken."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(f"thread {thread_id!r} already exists; choose another id.")


class InvalidThreadIdError(StoreError, ValueError):
    """Raised when a thread id is not of the form ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``."""

    def __init__(self, thread_id: object) -> None:
        self.thread_id = thread_id
        super().__init__(
            f"invalid thread id {thread_id!r}: use 1 to 128 characters from A-Z, a-z, 0-9, "
            "'.', '_' and '-', starting with a letter or digit."
        )


class StoreCorruptedError(StoreError):
    """Raised when stored data is damaged in a way that is not safe to repair automatically.

    ``thread_id`` names the thread; ``path`` and ``line`` say where in a file (a journal),
    ``sequence`` which event (a database row) when the store knows.
    """

    def __init__(
        self,
        message: str,
        *,
        thread_id: str | None = None,
        path: str | None = None,
        line: int | None = None,
        sequence: int | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.path = path
        self.line = line
        self.sequence = sequence
        super().__init__(message)


class SequenceConflictError(StoreError):
    """Raised when the journal is not where a write expected it; nothing was written.

    For a conditional append (``append_events(..., expected_last_sequence=N)``)
    ``expected`` is N and ``actual`` the thread's real last sequence. For an import,
    ``expected`` is the sequence the import had to start at and ``actual`` the one it had.
    ``got`` is the old name of ``actual``.
    """

    def __init__(
        self, thread_id: str, expected: int, actual: int, *, message: str | None = None
    ) -> None:
        self.thread_id = thread_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            message
            or (
                f"thread {thread_id!r}: expected sequence {expected} next, got {actual}; "
                "the journal changed underneath the import."
            )
        )

    @classmethod
    def conditional(cls, thread_id: str, expected: int, actual: int) -> SequenceConflictError:
        """Return the error of a conditional append that found the journal moved on."""
        return cls(
            thread_id,
            expected,
            actual,
            message=(
                f"thread {thread_id!r}: expected its last event to be sequence {expected}, "
                f"but it is {actual}; someone appended meanwhile. Read the thread again and "
                "decide anew."
            ),
        )

    @property
    def got(self) -> int:
        """Return :attr:`actual` (the name round 1 used)."""
        return self.actual


class LeaseLostError(StoreError):
    """Raised when an append of a session's thread finds that the session lost its lease
    (its connection to the database ended, or another session took the thread over);
    nothing of the batch was written. The session stops: the thread is the new holder's.
    """

    def __init__(self, thread_id: str, detail: str) -> None:
        self.thread_id = thread_id
        super().__init__(
            f"the lease of thread {thread_id!r} was lost ({detail}); this session stopped "
            "writing to it — another session may have taken the thread over. Open the "
            "thread again to go on"
        )


class UnserializableEventError(StoreError, TypeError):
    """Raised when an event cannot be serialised; nothing of its batch is stored."""


class CompactionError(RoderError):
    """Raised when a compaction does not commit a boundary.

    ``reason`` is the short discard reason (``disconnected``, ``failed``, ...), ``attempts``
    the number of provider calls made and ``usage`` the tokens they used (already billed).
    """

    def __init__(
        self,
        message: str,
        *,
        thread_id: str | None = None,
        reason: str = "",
        attempts: int = 0,
        usage: TokenUsage | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.reason = reason
        self.attempts = attempts
        self.usage = usage
        super().__init__(message)


class CompactionFailed(CompactionError):  # noqa: N818 - the contract's name
    """Raised when the candidate boundary was discarded; ``reason`` says why."""


class CompactionPreempted(CompactionError):  # noqa: N818 - the contract's name
    """Raised when a compaction was preempted (the user steered) before its commit."""


class BusyError(RoderError):
    """Raised when a bounded resource is taken or full; nothing was queued, try again later."""


class ThreadBusyError(BusyError):
    """Raised when another session holds the thread's lease; ``holder`` says who.

    ``holder`` is a :class:`roder_api.threads.LeaseHolder`, or None when the store cannot
    tell who holds it.
    """

    def __init__(self, thread_id: str, holder: LeaseHolder | None) -> None:
        self.thread_id = thread_id
        self.holder = holder
        who = holder.describe() if holder is not None else "another session"
        super().__init__(
            f"thread {thread_id!r} is in use by {who}; wait for that session to end "
            "or continue another thread."
        )


class InputTooLargeError(RoderError, ValueError):
    """Raised when input exceeds the configured size limit; nothing was queued."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"input of {size} bytes exceeds the limit of {limit} bytes "
            "(max_input_bytes); split it or raise the limit."
        )


class ToolCallNotOpenError(RoderError, ValueError):
    """Raised when a tool result given as input answers no open tool call of the thread
    (unknown, or already answered); nothing was written."""

    def __init__(self, thread_id: str, call_id: str, state: str = "is not open") -> None:
        self.thread_id = thread_id
        self.call_id = call_id
        super().__init__(
            f"tool call {call_id!r} {state} on thread {thread_id!r}; a tool result must "
            "answer a call the model made and nobody answered yet"
        )


class RecorderError(RoderError):
    """Raised when the event recorder refuses an event or has stopped after a failure."""


class RecorderFullError(BusyError, RecorderError):
    """Raised when the event recorder's queue is full (by count or bytes); try again later."""


class StoppedError(RoderError):
    """Raised when using a component that was closed or has stopped."""


__all__ = [
    "BusyError",
    "CompactionError",
    "CompactionFailed",
    "CompactionPreempted",
    "ConfigError",
    "DuplicateRegistrationError",
    "InputTooLargeError",
    "InvalidThreadIdError",
    "LeaseLostError",
    "MisconfiguredPluginError",
    "PluginError",
    "PluginLoadError",
    "PluginSettingsError",
    "RecorderError",
    "RecorderFullError",
    "RoderError",
    "SequenceConflictError",
    "StoppedError",
    "StoreCorruptedError",
    "StoreError",
    "ThreadBusyError",
    "ThreadExistsError",
    "ThreadNotFoundError",
    "ToolCallNotOpenError",
    "UnknownEngineError",
    "UnknownPluginIdError",
    "UnknownThreadStoreError",
    "UnserializableEventError",
    "check_settings",
]
