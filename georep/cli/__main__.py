"""``python -m georep.cli``: the ``georep`` command."""

from georep.cli import main

main()
