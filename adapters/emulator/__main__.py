"""``python -m georep.adapters.emulator``: run the emulator in the foreground."""

from georep.adapters.emulator._runner import main

raise SystemExit(main())
