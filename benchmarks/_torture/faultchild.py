"""A child process whose ``os.write`` / ``os.fsync`` / ``os.fdatasync`` can be made to fail.

Run as ``python -m _torture.faultchild PLAN_JSON``. The wrappers are installed *before* any
store module is imported (a store may bind ``os.fdatasync`` at import time), so the store
sees them exactly as it would see a failing disk. The plan says which call fails how, and
after how many calls of that kind inside the armed window. The child prints one JSON line:
what it committed and what each attempt raised.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from typing import Any

import orjson

_real_write = os.write
_real_fsync = os.fsync
_real_fdatasync = getattr(os, "fdatasync", os.fsync)


class Fault:
    """The armed fault: ``op`` (write, fsync), ``error`` (errno name or None), ``short``."""

    def __init__(self) -> None:
        self.armed = False
        self.op = "write"
        self.error: str | None = None
        self.short = False
        self.skip = 0
        self.injected = 0

    def arm(self, op: str, error: str | None, short: bool, skip: int) -> None:
        """Arm the fault for the next calls."""
        self.armed, self.op, self.error, self.short, self.skip = True, op, error, short, skip
        self.injected = 0

    def hit(self, op: str) -> bool:
        """Return True when this call must be faulted."""
        if not self.armed or op != self.op:
            return False
        if self.skip > 0:
            self.skip -= 1
            return False
        return True


FAULT = Fault()


def _write(fd: int, data: Any) -> int:
    if FAULT.hit("write"):
        view = memoryview(data)
        if FAULT.short and not FAULT.injected and len(view) > 1:
            # A short write: the kernel took only part of the buffer. The next call fails
            # when an error is planned (a disk that filled up mid-record).
            FAULT.injected += 1
            if FAULT.error is None:
                FAULT.armed = False
            return _real_write(fd, view[: len(view) // 2])
        if FAULT.error is not None:
            FAULT.injected += 1
            FAULT.armed = False
            code = getattr(errno, FAULT.error)
            raise OSError(code, os.strerror(code))
    return _real_write(fd, data)


def _sync(real: Callable[[Any], None]) -> Callable[[Any], None]:
    def sync(fd: Any) -> None:
        if FAULT.hit("fsync") and FAULT.error is not None:
            FAULT.injected += 1
            FAULT.armed = False
            code = getattr(errno, FAULT.error)
            raise OSError(code, os.strerror(code))
        real(fd)

    return sync


# setattr, not assignment: the wrappers take any fd-like argument, which typeshed spells
# differently for each function.
setattr(os, "write", _write)  # noqa: B010
setattr(os, "fsync", _sync(_real_fsync))  # noqa: B010
if hasattr(os, "fdatasync"):
    setattr(os, "fdatasync", _sync(_real_fdatasync))  # noqa: B010


async def _main(plan: dict[str, Any]) -> dict[str, Any]:
    import random

    from roder_api.errors import RoderError

    from .child import batch_events
    from .stores import StoreSpec

    rng = random.Random(plan["seed"])
    spec = StoreSpec(plan["spec"]["name"], plan["spec"]["backend"], plan["spec"]["settings"])
    store = await spec.factory().open()
    thread_id = plan["thread_id"]
    committed: list[dict[str, Any]] = []
    attempts: list[dict[str, Any]] = []

    async def append(batch_id: str) -> None:
        events, tokens = batch_events(batch_id, rng.randint(1, 5), rng)
        try:
            entries = await store.append_events(thread_id, events)
        except RoderError as exc:
            attempts.append({"b": batch_id, "error": type(exc).__name__, "message": str(exc)})
            return
        except BaseException as exc:  # noqa: BLE001 - an unclear error is what we look for
            attempts.append({"b": batch_id, "error": "!" + type(exc).__name__, "message": str(exc)})
            return
        committed.append({"b": batch_id, "s": entries[0].sequence, "n": len(events)})
        attempts.append({"b": batch_id, "error": None, "injected": FAULT.injected})

    for number in range(plan["before"]):
        await append(f"pre{plan['seed']}.{number}")
    FAULT.arm(plan["op"], plan["error"], plan["short"], plan["skip"])
    injected = 0
    for number in range(4):
        # ``skip`` lets the fault land on a later call (an index write, a second record).
        await append(f"hit{plan['seed']}.{number}")
        injected += FAULT.injected
        if FAULT.injected:
            break
    FAULT.armed = False
    await append(f"post{plan['seed']}")
    await store.aclose()
    return {"committed": committed, "attempts": attempts, "injected": injected}


def main() -> None:
    """Run the plan given as JSON in ``argv[1]`` and print the outcome as JSON."""
    import anyio

    plan = orjson.loads(sys.argv[1])
    result = anyio.run(_main, plan, backend=plan.get("backend", "asyncio"))
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
