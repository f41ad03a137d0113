"""``python -m georep.cli``: the ``georep`` command."""

from georep.cli._app import main

main()
