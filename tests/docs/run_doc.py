"""Execute the Python code in one Markdown file, block after block, as a reader would.

Usage: python tests/docs/run_doc.py FILE.md

Blocks share one namespace, in order, like a notebook. A block may ``await`` at top level
(it then runs on one event loop kept for the file); a block without ``await`` runs as plain
code, so it may call ``asyncio.run`` itself. Two HTML comments, invisible to readers:

- ``<!-- doc-setup`` ... ``-->`` holds Python that runs first (e.g. starting the emulator and
  defining ``primary_conn``); a name ``doc_teardown`` it defines is called at the end;
- ``<!-- doc-skip: REASON -->`` right before a fence leaves that block out (the reason is
  required: say why a reader's copy of it would not terminate here).

Exits 1 with the failing block's line number on the first error.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SETUP = re.compile(r"<!-- doc-setup\n(.*?)^-->", re.S | re.M)
SKIP = re.compile(r"<!-- doc-skip: (.+?) -->\s*$")


def blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line, code, skip reason) for every python block, setup blocks first."""
    found = [(text[: m.start()].count("\n") + 1, m.group(1), None) for m in SETUP.finditer(text)]
    for match in FENCE.finditer(text):
        line = text[: match.start()].count("\n") + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        found.append((line + 1, match.group(1), skip.group(1) if skip else None))
    return found


def main(path: Path) -> int:
    text = path.read_text()
    namespace: dict[str, Any] = {"__name__": "__main__"}
    loop = asyncio.new_event_loop()
    os.chdir(tempfile.mkdtemp(prefix="georep-doc-"))  # files a block writes land here
    ran = skipped = 0
    try:
        for line, code, skip in blocks(text):
            if skip is not None:
                skipped += 1
                continue
            compiled = compile(
                code, f"{path.name}:{line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            )
            try:
                if compiled.co_flags & inspect.CO_COROUTINE:
                    loop.run_until_complete(eval(compiled, namespace))
                else:
                    exec(compiled, namespace)
            except BaseException:
                traceback.print_exc()
                print(f"FAILED: the block at {path}:{line}", file=sys.stderr)
                return 1
            ran += 1
    finally:
        # Let what the examples scheduled (an aclose() from a signal handler) finish.
        pending = asyncio.all_tasks(loop)
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        teardown = namespace.get("doc_teardown")
        if callable(teardown):
            teardown()
        loop.close()
    print(f"{path.name}: {ran} blocks ran, {skipped} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
