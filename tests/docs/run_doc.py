"""Execute the code in one Markdown file, block after block, as a reader would.

Usage: python tests/docs/run_doc.py FILE.md

Python blocks share one namespace, in order, like a notebook. A block may ``await`` at top
level (it then runs on one event loop kept for the file); a block without ``await`` runs as
plain code, so it may call ``asyncio.run`` itself. Shell blocks (```bash) run only when
marked. HTML comments, invisible to readers, steer the run:

- ``<!-- doc-setup`` ... ``-->`` holds Python that runs first (e.g. starting the emulator and
  defining ``primary_conn``); a name ``doc_teardown`` it defines is called at the end;
- ``<!-- doc-step`` ... ``-->`` holds Python that runs in its place among the blocks: it
  stages a situation for the commands after it (an outage, a failover) or checks what the
  command before it printed (``doc_shell``, see below);
- ``<!-- doc-run -->`` right before a ```bash fence runs that block with ``bash -eo
  pipefail`` in the file's working directory, with the environment the Python blocks left
  in ``os.environ`` and this interpreter's ``bin`` first on ``PATH`` (so ``georep`` is the
  checkout's). It must exit 0, or N with ``<!-- doc-run: exits N -->``. Its
  ``subprocess.CompletedProcess`` (``stdout``, ``stderr``, ``returncode``) is then
  ``doc_shell`` for the steps after it; a ```bash block without the mark is not run;
- ``<!-- doc-skip: REASON -->`` right before a python fence leaves that block out (the
  reason is required: say why a reader's copy of it would not terminate here).

Exits 1 with the failing block's line number on the first error.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, NamedTuple

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SHELL = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
SETUP = re.compile(r"<!-- doc-setup\n(.*?)^-->", re.S | re.M)
STEP = re.compile(r"<!-- doc-step\n(.*?)^-->", re.S | re.M)
SKIP = re.compile(r"<!-- doc-skip: (.+?) -->\s*$")
RUN = re.compile(r"<!-- doc-run(?:: exits (\d+))? -->\s*$")


class Block(NamedTuple):
    """One piece of code the page runs (or skips)."""

    line: int
    code: str
    skip: str | None  # the doc-skip reason: not run
    kind: str = "python"  # "setup", "python", "step" or "shell"
    exits: int = 0  # a shell block's expected exit status


def _line_before(text: str, start: int) -> str:
    return text[:start].rstrip("\n").rsplit("\n", 1)[-1]


def blocks(text: str) -> list[Block]:
    """Every block that runs or is skipped: setup blocks first, then the others in the
    order of the page."""
    setups = [
        Block(text[: m.start()].count("\n") + 1, m.group(1), None, "setup")
        for m in SETUP.finditer(text)
    ]
    found: list[tuple[int, Block]] = []
    for match in FENCE.finditer(text):
        line = text[: match.start()].count("\n") + 1
        skip = SKIP.search(_line_before(text, match.start()))
        reason = skip.group(1) if skip else None
        found.append((match.start(), Block(line + 1, match.group(1), reason)))
    for match in STEP.finditer(text):
        line = text[: match.start()].count("\n") + 1
        found.append((match.start(), Block(line, match.group(1), None, "step")))
    for match in SHELL.finditer(text):
        run = RUN.search(_line_before(text, match.start()))
        if run is not None:
            line = text[: match.start()].count("\n") + 1
            exits = int(run.group(1) or 0)
            found.append((match.start(), Block(line + 1, match.group(1), None, "shell", exits)))
    return setups + [block for _, block in sorted(found, key=lambda item: item[0])]


def run_shell(block: Block, where: str) -> subprocess.CompletedProcess[str]:
    """Run a marked bash block; raise if it does not exit as the page says."""
    bin_dir = str(Path(sys.executable).parent)
    environment = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    environment.setdefault("COLUMNS", "160")  # rich's tables, unwrapped as in a terminal
    completed = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", block.code],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(f"$ {block.code.strip()}\n{completed.stdout}{completed.stderr}", flush=True)
    if completed.returncode != block.exits:
        raise AssertionError(
            f"{where}: the shell block exited {completed.returncode}, the page says {block.exits}"
        )
    return completed


def main(path: Path) -> int:
    text = path.read_text()
    namespace: dict[str, Any] = {"__name__": "__main__"}
    loop = asyncio.new_event_loop()
    os.chdir(tempfile.mkdtemp(prefix="georep-doc-"))  # files a block writes land here
    ran = skipped = 0
    try:
        for block in blocks(text):
            if block.skip is not None:
                skipped += 1
                continue
            where = f"{path.name}:{block.line}"
            if block.kind == "shell":
                try:
                    namespace["doc_shell"] = run_shell(block, where)
                except BaseException:
                    traceback.print_exc()
                    print(f"FAILED: the block at {path}:{block.line}", file=sys.stderr)
                    return 1
                ran += 1
                continue
            compiled = compile(block.code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            try:
                if compiled.co_flags & inspect.CO_COROUTINE:
                    loop.run_until_complete(eval(compiled, namespace))
                else:
                    exec(compiled, namespace)
            except BaseException:
                traceback.print_exc()
                print(f"FAILED: the block at {path}:{block.line}", file=sys.stderr)
                return 1
            ran += 1
    finally:
        # Let what the examples scheduled (an aclose() from a signal handler) finish; after
        # a failure, what a later block would have stopped is cancelled instead.
        pending = asyncio.all_tasks(loop)
        if pending:
            _, late = loop.run_until_complete(asyncio.wait(pending, timeout=30))
            for task in late:
                task.cancel()
            if late:
                loop.run_until_complete(asyncio.wait(late, timeout=10))
        teardown = namespace.get("doc_teardown")
        if callable(teardown):
            teardown()
        loop.close()
    print(f"{path.name}: {ran} blocks ran, {skipped} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
