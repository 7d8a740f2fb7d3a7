"""The store kit: building blocks for thread-store authors.

- :class:`FileLeases`: thread leases as OS file locks (released when the holder dies).
- :class:`GroupCommit`: concurrent commits share one blocking write-and-sync.
"""

from __future__ import annotations

from roder_api.storekit._file_leases import FileLeases
from roder_api.storekit._group_commit import GroupCommit

__all__ = ["FileLeases", "GroupCommit"]
