"""``python -m georep.adapters.emulator``: run the emulator in the foreground."""

from ._runner import main

raise SystemExit(main())
