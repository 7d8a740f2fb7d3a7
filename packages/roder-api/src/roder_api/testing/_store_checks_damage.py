"""Store checks: stored data damaged behind the store's back is refused, never misread.

The kit cannot damage a store by itself (that takes the store's medium: a file, a database
row). A store's test class overrides :meth:`DamageChecks.damage_event` to do it; the kit
then checks what every store promises: a read that meets the damage raises
``StoreCorruptedError`` naming the thread, and never returns events reordered, repeated or
silently short.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from roder_api.errors import StoreCorruptedError
from roder_api.testing._kit_support import make_metadata, user_item
from roder_api.testing._store_kit_base import StoreKitBase
from roder_api.threads import ThreadStore, ThreadStoreFactory

DAMAGE_KINDS = ("garbage", "missing", "missing_last")
"""What :meth:`DamageChecks.damage_event` is asked to do to one event of a closed store.

``garbage``: its stored form is no longer a Roder record (bad JSON, a foreign document, a
line that fails its checksum); ``missing``: it is removed (a gap in the sequences);
``missing_last``: the thread's last event is removed.
"""


class DamageChecks(StoreKitBase):
    """Checks that damaged events are refused with ``StoreCorruptedError``."""

    damage_events: ClassVar[int] = 6
    """How many one-event batches the damaged thread holds."""

    def damage_event(
        self, factory: ThreadStoreFactory, thread_id: str, sequence: int, kind: str
    ) -> bool:
        """Damage event ``sequence`` of ``thread_id`` as ``kind`` says (see DAMAGE_KINDS).

        Called with every store of ``factory`` closed. Return False when the store cannot
        be damaged that way from outside (the default: the checks are skipped).
        """
        return False

    @pytest.mark.parametrize("kind", DAMAGE_KINDS)
    async def test_a_damaged_event_is_refused_by_every_read(
        self, thread_store_factory: ThreadStoreFactory, kind: str
    ) -> None:
        """Reads meeting a damaged or missing event raise StoreCorruptedError naming the thread."""
        store: ThreadStore = await thread_store_factory.open()
        try:
            meta = await store.create_thread(make_metadata())
            for number in range(1, self.damage_events + 1):
                await store.append_events(meta.thread_id, [user_item(f"event {number}")])
        finally:
            await store.aclose()
        sequence = self.damage_events if kind == "missing_last" else self.damage_events // 2
        if not self.damage_event(thread_store_factory, meta.thread_id, sequence, kind):
            pytest.skip(f"this store cannot be damaged as {kind!r} from outside")
        store = await thread_store_factory.open()
        try:
            for name in ("read_events", "read_snapshot", "replay_events"):
                with pytest.raises(StoreCorruptedError) as caught:
                    await getattr(store, name)(meta.thread_id)
                error = caught.value
                assert error.thread_id == meta.thread_id, (name, error)
                assert error.sequence in (None, sequence), (name, error)
        finally:
            await store.aclose()
