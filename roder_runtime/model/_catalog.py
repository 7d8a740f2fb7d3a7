"""The model catalog: engines, default models and context windows, with the config they need.

Turns and compaction get a :class:`ModelCatalog` instead of the whole runtime. It caches the
context windows it learned (per catalog, so per runtime), asking an engine's
``list_models`` again only when it could not answer.
"""

from __future__ import annotations

import anyio

from roder_api.extension import ExtensionRegistry
from roder_api.inference import InferenceEngine, InferenceProviderContext
from roder_runtime.config._config import RuntimeConfig

DEFAULT_ENGINE = "scripted"
"""The engine used when no ``default_engine`` is configured."""
LIST_MODELS_TIMEOUT_S = 120.0
"""How long ``list_models`` may take when ``turn_timeout_s`` is unset (a turn's start waits)."""


class ModelCatalog:
    """The engines of a registry, their default models and context windows, and the config."""

    def __init__(self, registry: ExtensionRegistry, config: RuntimeConfig) -> None:
        self.registry = registry
        self.config = config
        self._windows: dict[tuple[str, str], int | None] = {}

    def engine(self, engine_id: str | None = None) -> InferenceEngine:
        """Return the engine ``engine_id``, or the default engine (``scripted`` when unset)."""
        return self.registry.inference_engine(
            engine_id or self.config.default_engine or DEFAULT_ENGINE
        )

    def default_model(self, engine: InferenceEngine) -> str:
        """Return the model to use on ``engine`` when none is asked for.

        ``default_model`` belongs to ``default_engine`` (to every engine when that is unset);
        other engines get their own ``default_model``, else ``<engine id>-default``.
        """
        default_engine = self.config.default_engine
        if self.config.default_model and default_engine in (None, engine.id):
            return self.config.default_model
        return engine.default_model or f"{engine.id}-default"

    async def context_window(self, engine: InferenceEngine, model: str) -> int | None:
        """Return the context window (tokens) the engine's ``list_models`` gives ``model``.

        A model the engine does not list gets the window all its listed models share, if
        they share one. None when unknown, or when the engine cannot list its models (or not
        within ``turn_timeout_s``, else :data:`LIST_MODELS_TIMEOUT_S`): then it is asked
        again next time.
        """
        key = (engine.id, model)
        if key in self._windows:
            return self._windows[key]
        ctx = InferenceProviderContext(settings=dict(self.config.engines.get(engine.id, {})))
        limit = self.config.turn_timeout_s
        try:
            with anyio.fail_after(LIST_MODELS_TIMEOUT_S if limit is None else limit):
                models = await engine.list_models(ctx)
        except Exception:  # noqa: BLE001 - an engine that cannot list models (in time): no window
            return None
        windows = {m.context_window for m in models}
        window = next((m.context_window for m in models if m.id == model), None)
        if window is None and len(windows) == 1:
            # An unlisted model (e.g. the runtime's derived default) of an engine whose models
            # all share one window: that window is the engine's, whatever the model's name.
            window = next(iter(windows))
        self._windows[key] = window
        return window
