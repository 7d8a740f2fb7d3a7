"""The journal's checksum is CRC-32 with zlib's polynomial, whoever computes it: ISA-L's
where ``isal`` is installed (faster), zlib's elsewhere. Journals framed by zlib (every one
written before) read the same, and a changed byte is still damage."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonl_helpers import journal_with

from roder_api.errors import StoreCorruptedError
from roder_jsonl_thread_store import JsonlThreadStoreFactory, _format
from roder_jsonl_thread_store._format import CRC_END, CRC_START, RECORD_START, crc32

FAST_MACHINES = {"x86_64", "AMD64", "aarch64", "arm64"}


@given(st.binary(max_size=4096))
def test_the_checksum_is_zlibs_crc32(data: bytes) -> None:
    assert crc32(data) == zlib.crc32(data)
    assert crc32(memoryview(data)) == zlib.crc32(data)


@pytest.mark.skipif(platform.machine() not in FAST_MACHINES, reason="isal has no wheel here")
def test_the_store_uses_isal_where_it_has_wheels() -> None:
    from isal import isal_zlib

    assert _format.crc32 is isal_zlib.crc32


def test_without_isal_the_store_uses_zlib_and_reads_what_isal_framed(tmp_path: Path) -> None:
    """Where isal is missing (no wheel for the machine), the checksum is zlib's, and a
    journal written with isal's reads back: run in a process where ``import isal`` fails."""
    script = textwrap.dedent(
        """
        import sys, zlib
        sys.modules["isal"] = None  # import isal raises ImportError, as if not installed
        import anyio
        from roder_jsonl_thread_store import JsonlThreadStoreFactory, _format

        assert _format.crc32 is zlib.crc32, _format.crc32

        async def main() -> None:
            store = await JsonlThreadStoreFactory(sys.argv[1]).open()
            snapshot = await store.read_snapshot("t")
            print(len(snapshot.items), [i.text for i in snapshot.items][-1])
            await store.aclose()

        anyio.run(main)
        """
    )

    async def write() -> None:
        await journal_with(JsonlThreadStoreFactory(tmp_path / "store"), "t", 12)

    anyio.run(write)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["12", "message", "11"]


def _reframed_by_zlib(raw: bytes) -> bytes:
    """Return the journal's lines framed again with ``zlib.crc32``, as older Roder wrote them."""
    out = []
    for line in raw.splitlines(keepends=True):
        body = line[RECORD_START:-2]
        out.append(line[:CRC_START] + b"%08x" % zlib.crc32(body) + line[CRC_END:])
    return b"".join(out)


@pytest.mark.anyio
@pytest.mark.core
async def test_a_journal_framed_by_zlib_reads_the_same_and_a_changed_byte_is_damage(
    factory: JsonlThreadStoreFactory,
) -> None:
    path = await journal_with(factory, "t", 30)
    written = path.read_bytes()
    assert _reframed_by_zlib(written) == written  # the same checksum, byte for byte
    store = await factory.open()
    try:
        snapshot = await store.read_snapshot("t")
        events = await store.read_events("t")
    finally:
        await store.aclose()
    assert len(snapshot.items) == 30 and len(events) == 30

    # One byte of one record changed, the file's size kept: the checksum catches it.
    at = written.index(b"message 17") + len(b"message ")
    damaged = written[:at] + b"7" + written[at + 1 :]
    assert len(damaged) == len(written)
    path.write_bytes(damaged)  # noqa: ASYNC240 - a test's setup
    store = await factory.open()
    try:
        with pytest.raises(StoreCorruptedError, match="checksum"):
            await store.read_snapshot("t")
    finally:
        await store.aclose()
