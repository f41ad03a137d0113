"""The soak (``georep soak``, docs/soak.md): many processes, a nemesis, a checker.

- :mod:`.schedule`: the seeded fault schedule (pure: same seed, same faults);
- :mod:`.nemesis`: plays a schedule against the running soak;
- :mod:`.worker`: one sender, receiver or syphon process;
- :mod:`.runner`: the emulator, Redis, the workers, the quiet period;
- :mod:`.checker`: the ledger's verdict per entity (the audit on each entity's slice);
- :mod:`.report`: report.json, report.md, timeline.png.
"""
