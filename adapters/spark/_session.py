"""One SparkSession per process, local-first: loopback only, no UI, quiet logs."""

from __future__ import annotations

__all__ = ["spark_session"]

import logging
import os
import re
import shutil
import sys
import threading
from collections.abc import Mapping
from importlib import resources

from pyspark.sql import SparkSession

from georep.exceptions import ConfigurationError

_log = logging.getLogger("georep.audit")
_lock = threading.Lock()
_LOCAL = re.compile(r"^local(\[(\*|\d+)(,\s*\d+)?\])?$")
_LOOPBACK_MASTER = re.compile(r"^spark://(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?$")


def _under_spark_submit() -> bool:
    """True when spark-submit started this Python driver (its JVM is already running)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _local_cores(master: str) -> int | None:
    match = _LOCAL.match(master)
    if match is None:
        return None
    cores = match.group(2)
    return os.cpu_count() or 1 if cores in (None, "*") else int(cores)


def _check_java() -> None:
    home = os.environ.get("JAVA_HOME")
    if (home and os.path.exists(os.path.join(home, "bin", "java"))) or shutil.which("java"):
        return
    raise ConfigurationError(
        "Spark needs a Java runtime (17 or newer) and found none on PATH or in JAVA_HOME: "
        "install one, e.g. apt-get install openjdk-17-jre-headless"
    )


def spark_session(
    master: str | None = "local[*]",
    *,
    app_name: str = "georep-audit",
    config: Mapping[str, str] | None = None,
) -> SparkSession:
    """The process's SparkSession, created on first use.

    A local master (``local``, ``local[N]``, ``local[*]``) binds the driver to 127.0.0.1
    (``SPARK_LOCAL_IP``, ``spark.driver.host``, ``spark.driver.bindAddress``) and uses four
    shuffle partitions per core; so does a standalone master on loopback
    (``spark://127.0.0.1:7077``, ``spark://localhost:7077``), whose executors must reach the
    driver there; its Python workers run this interpreter unless ``PYSPARK_PYTHON`` says
    otherwise. Every session runs with the UI off, UTC session time, error-only logs and
    data source options named like ``*connectionString*`` redacted in plans. A session that
    already exists in the process (yours, or one started by spark-submit) is reused as it
    is: Spark allows one per process.

    Args:
        master: Spark master URL; ``None`` leaves it to spark-submit (or Spark's default,
            ``local[*]``). Other masters (a remote ``spark://``, YARN, k8s) keep their own
            network settings.
        app_name: The Spark application name.
        config: Extra Spark settings, applied last (e.g. ``{"spark.driver.memory": "4g"}``).

    Returns:
        The SparkSession.

    Raises:
        ConfigurationError: No Java runtime to start Spark with.
    """
    with _lock:
        existing = SparkSession.getActiveSession()
        if existing is not None:
            current = existing.sparkContext.master
            if master is not None and current != master:
                _log.warning(
                    "a SparkSession with master %s already runs in this process; "
                    "using it instead of %s (one session per process)",
                    current,
                    master,
                )
            return existing
        if not _under_spark_submit():
            _check_java()
        builder = SparkSession.builder.appName(app_name)
        settings = {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            # Data source options shown in plans and the UI are redacted when their names
            # match: the georep format's connection strings as well as Spark's URLs.
            "spark.sql.redaction.options.regex": "(?i)url|connectionstring|secret|password",
        }
        cores = _local_cores(master or "local[*]") if not _under_spark_submit() else None
        if master is not None:
            builder = builder.master(master)
        if cores is None and not _under_spark_submit() and _LOOPBACK_MASTER.match(master or ""):
            cores = os.cpu_count() or 1
        if cores is not None:
            # Environment first: the JVM reads SPARK_LOCAL_IP when it starts.
            os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
            # Python workers (the georep data source's, UDFs') on this machine run this
            # interpreter, which has georep and pyarrow, unless the caller chose another:
            # Spark's default is whatever "python3" is on PATH.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            settings |= {
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.sql.shuffle.partitions": str(4 * cores),
            }
        if not _under_spark_submit():
            log_config = resources.files(__package__).joinpath("log4j2.properties")
            settings["spark.driver.extraJavaOptions"] = (
                f"-Dlog4j2.configurationFile=file:{log_config}"
            )
        for key, value in (settings | dict(config or {})).items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        return session
