"""``storekit.close_on_fork``: a registered descriptor is ``/dev/null`` in a forked child and
untouched in the parent; a registered number closed and reused for another file is left
alone (real forks, real files)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from roder_api.storekit import close_on_fork, forget_on_fork


def in_child(fd: int) -> str:
    """Return what ``fd`` is in a forked child: ``null``, ``file`` or ``closed``."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            what = "null" if os.fstat(fd).st_rdev == os.stat(os.devnull).st_rdev else "file"
        except OSError:
            what = "closed"
        os.write(write, what.encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    answer = os.read(read, 16).decode()
    os.close(read)
    return answer


def test_a_registered_descriptor_is_dev_null_in_a_forked_child(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "lease", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    try:
        assert in_child(fd) == "file"
        close_on_fork(fd)
        assert in_child(fd) == "null"
        assert os.fstat(fd).st_size == 0 and os.write(fd, b"x") == 1  # the parent's is intact
        forget_on_fork(fd)
        assert in_child(fd) == "file"
    finally:
        forget_on_fork(fd)
        os.close(fd)


def test_a_closed_and_reused_number_is_left_alone(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "first", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    close_on_fork(fd)
    os.close(fd)  # closed without forget_on_fork, as a pool closes a connection
    other = os.open(tmp_path / "second", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    again = other
    if other != fd:  # make sure the number is reused for another file
        again = os.dup2(other, fd, inheritable=False)
        os.close(other)
    try:
        assert again == fd
        assert in_child(again) == "file"
    finally:
        os.close(again)
