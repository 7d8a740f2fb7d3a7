"""``python -m roder_runtime`` runs the ``roder`` command."""

from roder_runtime._cli import run

run()
