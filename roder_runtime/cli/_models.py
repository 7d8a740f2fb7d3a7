"""``roder models``: the models each engine offers, and which one it uses by default."""

from __future__ import annotations

import argparse
from typing import Any

import anyio

from roder_api.errors import RoderError
from roder_api.inference import (
    InferenceEngine,
    InferenceProviderContext,
    ModelDescriptor,
    ProviderFailure,
)
from roder_runtime._runtime import Runtime
from roder_runtime.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    add_command,
    add_json_flag,
    open_runtime,
    print_json,
)

LIST_TIMEOUT_S = 30.0
"""How long one engine may take to list its models (a server may be asked)."""


def register(subparsers: Any) -> None:
    """Add the ``models`` command."""
    parser = add_command(
        subparsers,
        "models",
        help="list the models of every engine (or one)",
        description=(
            "List the models each engine offers (a server engine may ask its server) and the "
            "one it uses when no --model is given. An engine that cannot list its models is "
            "reported; the exit status is 1 when the engine asked for (or every engine) "
            "could not."
        ),
        examples=("roder models", "roder models --engine ollama", "roder models --json"),
    )
    parser.add_argument("--engine", metavar="ID", help="only this engine")
    add_json_flag(parser)
    parser.set_defaults(handler=models_command)


async def _list(
    runtime: Runtime, engine: InferenceEngine
) -> tuple[list[ModelDescriptor], str | None]:
    settings = runtime.config.engines.get(engine.id, {})
    try:
        with anyio.fail_after(LIST_TIMEOUT_S):
            found = await engine.list_models(InferenceProviderContext(settings=settings))
        return list(found), None
    except TimeoutError:
        return [], f"listing the models took more than {LIST_TIMEOUT_S:g} s"
    except (ProviderFailure, RoderError) as exc:
        return [], str(exc)


async def models_command(args: argparse.Namespace) -> int:
    """Print each engine's models, marking its default."""
    async with open_runtime(args) as runtime:
        if args.engine:
            engines = [runtime.engine(args.engine)]
        else:
            # .get: a declared engine whose plugin turns out misconfigured is not there.
            found = (runtime.registry.engines.get(i) for i in sorted(runtime.registry.engines))
            engines = [engine for engine in found if engine is not None]
        report = []
        for engine in engines:
            models, error = await _list(runtime, engine)
            report.append((engine, runtime.default_model(engine), models, error))
    if args.json:
        print_json(
            [
                {
                    "engine": engine.id,
                    "default_model": default,
                    "models": [
                        {
                            "id": m.id,
                            "context_window": m.context_window,
                            "max_output_tokens": m.max_output_tokens,
                            "display_name": m.display_name,
                        }
                        for m in models
                    ],
                    "error": error,
                }
                for engine, default, models, error in report
            ]
        )
    else:
        for engine, default, models, error in report:
            print(f"{engine.id}  (default model: {default})")
            if error is not None:
                print(f"  cannot list models: {error}")
            for model in models:
                window = f"  {model.context_window} tokens" if model.context_window else ""
                mark = "  (default)" if model.id == default else ""
                print(f"  {model.id}{window}{mark}")
    # Failure: the engine asked for could not list its models, or no engine could.
    return EXIT_FAILURE if all(error for *_, error in report) else EXIT_OK
