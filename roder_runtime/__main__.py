"""``python -m roder_runtime`` runs the ``roder`` command."""

from roder_runtime.cli import run

run()
