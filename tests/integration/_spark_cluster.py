"""A Spark standalone cluster on loopback for one test module: a master and two workers,
started with pyspark's own launcher (``bin/spark-class``) and stopped by their PIDs.

Everything binds to 127.0.0.1: ``SPARK_LOCAL_IP`` for the RPC endpoints and the web UIs
(which otherwise listen on every interface), ``--host`` for master and workers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cluster_env() -> dict[str, str]:
    """The environment every process of the cluster, and its drivers, runs with."""
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_NO_DAEMONIZE": "1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # The master's REST submission server listens on a fixed port (6066) otherwise.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
    }


@dataclass(frozen=True)
class SparkCluster:
    master_url: str
    log_dir: Path

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in self.log_dir.glob("*.log"))


def _launch(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # spark-class execs java: one group to stop
        )


def _wait_for(log: Path, text: str, count: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if log.exists() and log.read_text(errors="replace").count(text) >= count:
            return
        if process.poll() is not None:
            raise RuntimeError(f"spark exited with {process.returncode}:\n{log.read_text()}")
        time.sleep(0.2)
    raise TimeoutError(f"spark did not log {text!r} {count}x in 90 s:\n{log.read_text()[-3000:]}")


@contextmanager
def spark_standalone(work: Path, *, workers: int = 2, cores: int = 1) -> Iterator[SparkCluster]:
    """Start a master and ``workers`` workers on loopback; stop them all on exit."""
    work.mkdir(parents=True, exist_ok=True)
    env = cluster_env()
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []
    master_log = work / "master.log"
    try:
        master = _launch(
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
             str(port), "--webui-port", str(_free_port())],
            master_log, env,
        )  # fmt: skip
        processes.append(master)
        _wait_for(master_log, "I have been elected leader", 1, master)
        for index in range(workers):
            worker = ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                      "--cores", str(cores), "--memory", "1g", "--webui-port", "0",
                      "--work-dir", str(work / f"worker-{index}"), url]  # fmt: skip
            processes.append(_launch(worker, work / f"worker-{index}.log", env))
        _wait_for(master_log, "Registering worker", workers, master)
        yield SparkCluster(url, work)
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
