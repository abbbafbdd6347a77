"""``python -m dsgen`` runs the CLI."""

from dsgen.cli import main

main()
