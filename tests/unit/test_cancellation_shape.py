"""No code of georep's swallows a caller's cancellation by its shape.

Two shapes lose a ``CancelledError`` that was meant for the *caller*: an ``await`` inside
``with contextlib.suppress(..., CancelledError, ...)`` (the usual ``task.cancel()`` then
``suppress`` + ``await task``: a cancellation of the caller that arrives during the wait is
suppressed with the task's), and an ``except CancelledError:`` (or ``BaseException``)
handler that does not raise again. Reading the code found both (a pull receiver's close,
the demo's and the syphon command's shutdown); this test finds the next one before a user
does. Stop a task with ``georep._lifecycle.stop_task`` / ``finish_task``, or wait with
``asyncio.wait``, which never raises the awaited task's cancellation.

A third shape is Python 3.11's own: ``asyncio.wait_for`` returns a result that arrives
together with the caller's cancellation, and the cancellation is lost (the SDK's AMQP
layer does this; georep's deadlines raise it again). georep's code bounds a wait with
``georep._lifecycle.wait_within`` (``asyncio.timeout``) instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(REPO / "georep").rglob("*.py"), *(REPO / "adapters").rglob("*.py")])

#: A flagged line (or one of the two above it) carrying this comment, with the reason after it,
#: is allowed: e.g. a worker thread handing an exception to its caller's future.
ALLOW = "# cancellation:"


def _names(node: ast.expr | None) -> set[str]:
    """The exception class names a ``suppress(...)`` call or an ``except`` clause names."""
    if node is None:
        return {"BaseException"}  # a bare except
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def _catches_cancellation(names: set[str]) -> bool:
    return bool(names & {"CancelledError", "BaseException"})


def _awaits(body: list[ast.stmt]) -> bool:
    for statement in body:
        for sub in ast.walk(statement):
            if isinstance(sub, ast.Await | ast.AsyncFor | ast.AsyncWith):
                return True
    return False


def _raises(body: list[ast.stmt]) -> bool:
    return any(isinstance(sub, ast.Raise) for s in body for sub in ast.walk(s))


def findings(source: str, path: str) -> list[str]:
    """Where ``source`` swallows a cancellation by shape (``path:line: what``)."""
    tree = ast.parse(source)
    lines = source.splitlines()

    def allowed(line: int) -> bool:
        return any(ALLOW in lines[i] for i in range(line - 3, line) if 0 <= i < len(lines))

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                call = item.context_expr
                if (
                    isinstance(call, ast.Call)
                    and "suppress" in _names(call.func)
                    and any(_catches_cancellation(_names(arg)) for arg in call.args)
                    and _awaits(node.body)
                    and not allowed(node.lineno)
                ):
                    found.append(f"{path}:{node.lineno}: await inside suppress(CancelledError)")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "wait_for"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "asyncio"
            and not allowed(node.lineno)
        ):
            found.append(f"{path}:{node.lineno}: asyncio.wait_for (use wait_within)")
        elif isinstance(node, ast.ExceptHandler) and (
            _catches_cancellation(_names(node.type))
            and not _raises(node.body)
            and not allowed(node.lineno)
        ):
            found.append(f"{path}:{node.lineno}: except CancelledError that does not raise again")
    return found


def test_the_check_finds_each_shape() -> None:
    swallowing = """
import asyncio, contextlib
async def close(task):
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
async def run(work):
    try:
        await work()
    except asyncio.CancelledError:
        pass
async def bounded(work):
    return await asyncio.wait_for(work(), 5)
async def fine(work):
    try:
        await work()
    except BaseException:
        await cleanup()
        raise
"""
    assert [f.split(": ", 1)[1] for f in findings(swallowing, "x.py")] == [
        "await inside suppress(CancelledError)",
        "except CancelledError that does not raise again",
        "asyncio.wait_for (use wait_within)",
    ]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_source_swallows_a_cancellation_by_shape(path: Path) -> None:
    assert findings(path.read_text(encoding="utf-8"), str(path.relative_to(REPO))) == []
