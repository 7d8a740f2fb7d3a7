"""Run dispatch: who answers a run once its input is journaled (``roder serve --dispatch``).

A run is accepted when its input is journaled (``InputAccepted``); dispatch only schedules
who answers it. ``inprocess`` (the default) is :class:`roder_server.Dispatcher`'s own: the
process that accepted the run opens a session on the thread (or the lease holder's session
follows the journal). Any other dispatcher is found by id among the entry points of group
:data:`DISPATCH_GROUP` (``roder-temporal`` registers ``temporal``): the object there is a
:class:`RunDispatcherFactory`, opened by ``roder serve`` for its whole life. roder-server
never imports such a plugin by name.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from roder_server._protocol import ServerRuntime

DISPATCH_GROUP = "roder_server.dispatchers"
"""The entry-point group of run dispatchers (name: the dispatcher's id)."""

INPROCESS = "inprocess"
"""The id of the default dispatch: the accepting process answers (or the lease holder)."""


@dataclass(frozen=True, slots=True)
class AcceptedRun:
    """A run whose input is journaled: its tenant (``""``: the default), thread and turn."""

    tenant: str
    thread_id: str
    turn_id: str


class RunDispatcher(Protocol):
    """Schedules who answers accepted runs (the input is journaled before it is called)."""

    async def dispatch(self, run: AcceptedRun) -> None:
        """Schedule ``run`` to be answered; calling it twice for one run is harmless.

        Raise when it could not be scheduled: the run stays accepted (journaled) and the
        dispatcher's own sweep of threads with unanswered input must find it later.
        """
        ...


class RunDispatcherFactory(Protocol):
    """What a :data:`DISPATCH_GROUP` entry point names: a dispatcher by ``id``."""

    id: str

    def open(
        self,
        settings: Mapping[str, Mapping[str, Any]],
        runtimes: Mapping[str, ServerRuntime],
        *,
        owner: str,
    ) -> AbstractAsyncContextManager[RunDispatcher]:
        """Return the dispatcher for ``runtimes`` (tenant name to runtime; ``""`` is the
        default tenant), configured by the plugins' ``settings`` (raw tables by name);
        it is open for the async context's life. ``owner`` names this process."""
        ...


class UnknownDispatcherError(LookupError):
    """Raised when no installed plugin has the dispatcher asked for (``.dispatcher_id``)."""

    def __init__(self, dispatcher_id: str, installed: list[str]) -> None:
        self.dispatcher_id = dispatcher_id
        hint = " (pip install roder-temporal)" if dispatcher_id == "temporal" else ""
        super().__init__(
            f"no run dispatcher {dispatcher_id!r} is installed{hint}; installed: "
            f"{', '.join([INPROCESS, *installed])}"
        )


def find_dispatcher(dispatcher_id: str) -> RunDispatcherFactory:
    """Return the factory of the dispatcher ``dispatcher_id`` from the entry points of
    :data:`DISPATCH_GROUP`; raise :class:`UnknownDispatcherError` when none has it."""
    found = importlib.metadata.entry_points(group=DISPATCH_GROUP)
    for entry in found:
        if entry.name == dispatcher_id:
            factory: RunDispatcherFactory = entry.load()
            return factory
    raise UnknownDispatcherError(dispatcher_id, sorted({e.name for e in found}))
