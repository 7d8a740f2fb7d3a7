"""The Roder runtime: sessions, turns, the recorder, compaction, retries, config and the CLI.

Machinery lives in private modules of subpackages grouped by lifecycle (each package's
docstring says what it owns and may import; docs/architecture.md draws the rooms); the
public names are re-exported here, each imported on first use (PEP 562) so that the
``roder`` command pays only for what it runs. The Runtime's own module sits above the sessions:

_runtime may import: config, store, model, tools, compaction, session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roder_api import __version__ as _api_version
from roder_api import lazy_exports

if TYPE_CHECKING:
    from roder_runtime._runtime import DEFAULT_ENGINE, Runtime
    from roder_runtime.compaction._compaction import CompactionResult
    from roder_runtime.config._config import (
        RuntimeConfig,
        default_config_path,
        load_config,
        roder_home,
    )
    from roder_runtime.config._sections import (
        BudgetConfig,
        CompactionConfig,
        ReliabilityConfig,
        ToolsConfig,
    )
    from roder_runtime.session._ops import Interrupt, Op, Steer, UserInput
    from roder_runtime.session._session import Session
    from roder_runtime.store._journal import ReplayHistory
    from roder_runtime.tools._tool_step import ApproveToolCall

__version__ = _api_version

__all__ = [
    "ApproveToolCall",
    "BudgetConfig",
    "CompactionConfig",
    "CompactionResult",
    "DEFAULT_ENGINE",
    "Interrupt",
    "Op",
    "ReliabilityConfig",
    "ReplayHistory",
    "Runtime",
    "RuntimeConfig",
    "Session",
    "Steer",
    "ToolsConfig",
    "UserInput",
    "__version__",
    "default_config_path",
    "load_config",
    "roder_home",
]

_LAZY = {
    "ApproveToolCall": "roder_runtime.tools._tool_step",
    "BudgetConfig": "roder_runtime.config._sections",
    "CompactionConfig": "roder_runtime.config._sections",
    "CompactionResult": "roder_runtime.compaction._compaction",
    "DEFAULT_ENGINE": "roder_runtime._runtime",
    "Interrupt": "roder_runtime.session._ops",
    "Op": "roder_runtime.session._ops",
    "ReliabilityConfig": "roder_runtime.config._sections",
    "ReplayHistory": "roder_runtime.store._journal",
    "Runtime": "roder_runtime._runtime",
    "RuntimeConfig": "roder_runtime.config._config",
    "Session": "roder_runtime.session._session",
    "Steer": "roder_runtime.session._ops",
    "ToolsConfig": "roder_runtime.config._sections",
    "UserInput": "roder_runtime.session._ops",
    "default_config_path": "roder_runtime.config._config",
    "load_config": "roder_runtime.config._config",
    "roder_home": "roder_runtime.config._config",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
