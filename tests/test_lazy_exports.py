"""``roder_api.lazy_exports``: the one PEP 562 re-export mechanism the packages share."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.core

PROBE = """
import sys, types
from roder_api import lazy_exports

package = types.ModuleType("probe_pkg")
sys.modules["probe_pkg"] = package
package.__getattr__, package.__dir__ = lazy_exports(
    "probe_pkg", {"dumps": "json", "decoder": "json.decoder", "missing": "json"}
)
assert "dumps" in dir(package) and "decoder" in dir(package)
assert "dumps" not in vars(package)            # nothing imported or kept before first use
import json, json.decoder
assert package.dumps is json.dumps             # a name: the attribute of its module
assert vars(package)["dumps"] is json.dumps    # kept: later uses are plain reads
assert package.decoder is json.decoder         # the module's own last name: the module
try:
    package.nothing
except AttributeError as exc:
    assert "probe_pkg" in str(exc) and "nothing" in str(exc), exc
else:
    raise AssertionError("an unknown name must raise AttributeError")
try:
    package.missing                             # json has no attribute 'missing'
except AttributeError:
    pass
else:
    raise AssertionError("a name its module lacks must raise AttributeError")
print("ok")
"""


def test_lazy_exports_imports_on_first_use_keeps_and_refuses_unknown_names() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_every_package_using_it_imports_nothing_lazy_until_asked() -> None:
    probe = (
        "import sys, roder_api, roder_runtime, roder_runtime.threads, roder_api.storekit\n"
        "lazy = ['roder_api.extension', 'roder_runtime._runtime',"
        " 'roder_runtime.threads._migration', 'roder_api.storekit._relational']\n"
        "print([m for m in lazy if m in sys.modules])\n"
        "roder_runtime.Runtime; roder_runtime.threads.migrate;"
        " roder_api.storekit.RelationalThreadStore\n"
        "print(sorted(m for m in lazy[1:] if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.splitlines()
    assert (
        "roder_runtime._runtime" not in before and "roder_runtime.threads._migration" not in before
    )
    assert after == str(
        sorted(
            [
                "roder_api.storekit._relational",
                "roder_runtime._runtime",
                "roder_runtime.threads._migration",
            ]
        )
    )
