"""The throw-away Redis servers (``embedded_redis_url``, ``private_redis_server``,
``private_redis_cluster``) end with the process that started them, however it ends: a
process killed outright runs no exit hooks, and each such kill used to leave a
``redis-server`` and its directory behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _helpers import eventually

pytestmark = pytest.mark.integration

# Prints the embedded server's pid and directories, then waits to be killed (or, given
# "exit", exits normally); or starts a private cluster or server and waits.
_CHILD = """
import json, sys, time
from georep.adapters.redis import _embedded, embedded_redis_url, private_redis_server

if sys.argv[1] == "embedded":
    embedded_redis_url()
    server = _embedded._server
    print(json.dumps({"pid": server.pid, "dirs": [server.redis_dir, server.dbdir]}), flush=True)
    if sys.argv[2] == "exit":
        sys.exit(0)
    time.sleep(120)
elif sys.argv[1] == "cluster":
    with _embedded.private_redis_cluster(3, replicas=0) as cluster:
        print(json.dumps({"ports": cluster.ports}), flush=True)
        time.sleep(120)
else:
    with private_redis_server() as url:
        print(json.dumps({"url": url}), flush=True)
        time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (an exited child not yet reaped) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[1].split()[0] != "Z"


def _all_exist(paths: list[str]) -> bool:
    return all(map(os.path.isdir, paths))


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.split(")")[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _start(kind: str, ending: str = "kill") -> tuple[subprocess.Popen[str], dict[str, Any]]:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, kind, ending],
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "REDIS_URL"},
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line, f"the child printed nothing (exit code {child.wait()})"
    return child, json.loads(line)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
async def test_the_embedded_server_stops_when_its_process_is_killed(how: int) -> None:
    child, info = _start("embedded")
    pid, dirs = int(info["pid"]), [str(d) for d in info["dirs"]]
    assert _alive(pid) and _all_exist(dirs)
    child.send_signal(how)
    child.wait(timeout=30)
    assert await eventually(lambda: not _alive(pid), within=10), "the server outlived its owner"
    assert await eventually(lambda: not any(map(os.path.exists, dirs)), within=10), dirs


async def test_the_embedded_server_and_its_watchdog_go_on_a_normal_exit() -> None:
    child, info = _start("embedded", "exit")
    pid = int(info["pid"])
    watchdogs = _children_of(child.pid)
    assert child.wait(timeout=30) == 0
    assert await eventually(lambda: not _alive(pid), within=10)
    # The watchdog was dismissed: it left without killing anything, and is gone.
    assert await eventually(lambda: not any(_alive(w) for w in watchdogs), within=10)


@pytest.mark.parametrize(("kind", "servers"), [("private", 1), ("cluster", 3)])
async def test_private_servers_stop_when_their_process_is_killed(kind: str, servers: int) -> None:
    child, _ = _start(kind)
    started = [p for p in _children_of(child.pid) if "redis-server" in _cmdline(p)]
    assert len(started) == servers, started
    child.kill()
    child.wait(timeout=30)
    assert await eventually(lambda: not any(map(_alive, started)), within=10)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
