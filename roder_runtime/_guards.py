"""Guards around plugin code the runtime calls, so a misbehaving plugin fails clearly."""

from __future__ import annotations

from roder_api.errors import RoderError, StoreError
from roder_api.threads import ThreadStore, ThreadStoreFactory


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
