"""Write tests/durations.json, the seconds each unit of the suite took, from a run's report:

    GEOREP_CPU_REPORT=/tmp/report.jsonl bash scripts/test.sh
    .venv/bin/python scripts/test_durations.py /tmp/report.jsonl

tests/conftest.py hands the units out longest first by these figures; a unit missing from
the file (a new module) is guessed. Re-take them when modules are added or change a lot.
Each test's seconds count for the unit tests/conftest.py puts it in now, so a report taken
before the units changed still serves.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
OUT = TESTS / "durations.json"


def main(report: str) -> int:
    sys.path.insert(0, str(TESTS))
    from conftest import unit_of

    seconds: dict[str, float] = defaultdict(float)
    with open(report, encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            seconds[unit_of(row["test"])] += row["wall"]
    units = {unit: round(total, 1) for unit, total in sorted(seconds.items())}
    OUT.write_text(json.dumps(units, indent=1) + "\n", encoding="utf-8")
    print(f"{OUT}: {len(units)} units, {sum(units.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
