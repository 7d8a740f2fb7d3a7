"""The pluggy markers of the ``roder`` project."""

from __future__ import annotations

import pluggy

PROJECT_NAME = "roder"
"""The pluggy project name and the entry-point group plugins are found in."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
"""Marks a hook specification in :mod:`roder_api.hookspecs`."""

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks a plugin's hook implementation: ``@roder_api.hookimpl``."""
