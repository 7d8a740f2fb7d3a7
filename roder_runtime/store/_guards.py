"""Guards around plugin code the runtime calls, so a misbehaving plugin fails clearly, and
the choice of the store plugin the configuration names."""

from __future__ import annotations

from roder_api.errors import RoderError, StoreError, UnknownThreadStoreError
from roder_api.extension import ExtensionRegistry
from roder_api.threads import ThreadStore, ThreadStoreFactory


def configured_store_factory(
    registry: ExtensionRegistry, configured: str | None
) -> ThreadStoreFactory:
    """Return the store factory ``configured`` names, else the only one, else ``jsonl``.

    Raise ``UnknownThreadStoreError`` when none is registered (or the configured id is
    unknown) and ``RoderError`` when several are and the configuration chooses none.
    """
    factories = registry.thread_store_factories
    if configured is not None:
        return registry.thread_store_factory(configured)
    if len(factories) == 1:
        return next(iter(factories.values()))
    if "jsonl" in factories:
        return factories["jsonl"]
    if not factories:
        raise UnknownThreadStoreError("jsonl", ())
    raise RoderError(
        "several thread stores are registered ("
        + ", ".join(sorted(factories))
        + "); choose one with [thread_store] backend = ... in config.toml"
    )


async def open_store(factory: ThreadStoreFactory) -> ThreadStore:
    """Return ``factory.open()``; raise ``StoreError`` naming the store if it raises anything.

    A ``RoderError`` passes as it is (it already says what to do); any other exception from
    the plugin is wrapped, with the original as ``__cause__``. Nothing is cached on failure,
    so the next call tries again.
    """
    try:
        return await factory.open()
    except RoderError:
        raise
    except Exception as exc:  # noqa: BLE001 - a store plugin may raise anything
        raise StoreError(
            f"thread store {getattr(factory, 'id', '?')!r} failed to open: "
            f"{type(exc).__name__}: {exc}; check its settings, or fix or replace the plugin"
        ) from exc
