"""The store kit: building blocks for thread-store authors.

- :class:`FileLeases`: thread leases as OS file locks (released when the holder dies).
"""

from __future__ import annotations

from roder_api.storekit._file_leases import FileLeases

__all__ = ["FileLeases"]
