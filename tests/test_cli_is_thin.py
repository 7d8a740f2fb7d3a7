"""The CLI is a client: no module of ``roder_runtime/cli`` calls a thread store itself.

Commands parse, call the Runtime or ``roder_runtime.threads`` (whose store calls are
bounded by the runtime's deadline), and print. An AST scan finds what would go around
that: ``runtime.store()``, a journal's ``.store``, a store factory's ``.open()``, and
any call of a store method on something that is not the runtime.
"""

from __future__ import annotations

import ast
import inspect

import pytest

from roder_api.storekit import RepairableThreadStore
from roder_api.threads import ThreadStore, ThreadStoreFactory

from .conftest import REPO

pytestmark = pytest.mark.core

STORE_METHODS = frozenset(
    name
    for cls in (ThreadStore, RepairableThreadStore, ThreadStoreFactory)
    for name, _ in inspect.getmembers(cls, callable)
    if not name.startswith("_") and name not in ("describe", "aclose")
)
"""Every public method of the store contracts but ``describe`` (it names the store) and
``aclose`` (sessions and registries close too; the runtime closes its store)."""

RUNTIME_RECEIVERS = frozenset({"runtime", "self.runtime"})
"""What a command calls the Runtime (whose methods share some store method names)."""

NOT_STORES = frozenset({"os", "Runtime", "await Runtime"})
"""Receivers whose ``open`` is not a store factory's."""


def store_calls(source: str) -> list[str]:
    """Return each place in ``source`` that reaches a thread store around the Runtime."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "store":
            # runtime.store() and journal.store alike: the raw store, unbounded.
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = ast.unparse(node.func.value)
            bounded = receiver.startswith("await runtime.journal(")  # bounded journal calls
            if (
                node.func.attr in STORE_METHODS
                and receiver not in RUNTIME_RECEIVERS
                and receiver not in NOT_STORES
                and not bounded
            ):
                found.append(f"{node.lineno}: {ast.unparse(node.func)}(...)")
    return found


def test_the_scan_finds_store_calls() -> None:
    sample = (
        "async def f(runtime, factory, journal):\n"
        "    store = await runtime.store()\n"
        "    await store.read_events('t')\n"
        "    await (await factory.open()).aclose()\n"
        "    await journal.store.get_thread('t')\n"
        "    await runtime.get_thread('t')\n"
        "    os.open('x', 0)\n"
        "    await (await runtime.journal('t')).read_events()\n"
    )
    assert sorted(store_calls(sample)) == [
        "2: runtime.store",
        "3: store.read_events(...)",
        "4: factory.open(...)",
        "5: journal.store",
        "5: journal.store.get_thread(...)",
    ]
    assert {"read_events", "import_events", "lease", "check_thread", "open"} <= STORE_METHODS


def test_no_cli_module_calls_the_store_around_the_runtime() -> None:
    modules = sorted((REPO / "roder_runtime" / "cli").glob("*.py"))
    assert len(modules) > 10, "the scan found no CLI modules"
    offences = {
        path.name: calls
        for path in modules
        if (calls := store_calls(path.read_text(encoding="utf-8")))
    }
    assert offences == {}
