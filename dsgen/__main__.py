"""``python -m dsgen`` runs the CLI exactly as the ``dsgen`` console script does."""

from dsgen.cli import main

main()
