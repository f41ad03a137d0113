"""How scripts/test.sh spreads the suite over workers.

Most of the suite waits (on lock expiries, outages, subprocesses), so it runs on more
workers than cores; what it must not do is start many Java virtual machines at once: each
Spark start costs seconds of CPU, and on two cores a burst of them starves the tests that
time an outage. So:

- the tests that run Spark form two **lanes** (:data:`LANES`), each run in order by one
  worker, from the start: never more than two Spark jobs at a time, and the in-process
  Spark session of a lane is started once;
- every other module is a unit that one worker runs (its module fixtures, an emulator or a
  Redis Cluster, start once), except the modules in :data:`SPLIT`, whose tests are
  independent and each a unit of its own, so that a long module is spread over workers,
  and those in :data:`BY_PARAMETER`, whose tests with one parameter form a unit (the
  drop-in client's: a sample program's raw run, module-scoped, is then made once for the
  two tests that compare with it);
- units go out longest first: the lanes, then the others by the seconds they took in a
  recent run (:data:`DURATIONS`, ``tests/durations.json``), so that no long unit starts
  last and leaves the other workers idle at the end (a long module handed out in
  collection order, late, made a tail of 70 s with one or two workers busy);
- at most :data:`HEAVY_AT_ONCE` units with a test marked ``heavy`` (many processes, or
  thousands of messages through the emulator) are handed out at once, besides the lanes:
  a worker that would get one while that many run gets the next light unit instead. Ten
  heavy units at once (the first wave, before) made the machine run each of them three to
  five times slower than alone, and timed waits inside them (a lock renewed, a session's
  predecessor awaited, a doc's 240 s) ran out;
- a worker that runs anything but a lane runs it at a lower priority (:data:`BESIDE_LANES`,
  a nice value): a lane's processes get the CPU first. Spark gives the Python process it
  starts for a data source's planning ten seconds (hard-coded) to connect back; on a
  fresh clone of the suite, two slow cores and ten workers starting at once, it took
  longer, and three Spark source tests failed on "Python worker failed to connect back".

With ``pytest -n N --dist-units --no-loadscope-reorder`` (what scripts/test.sh runs) the
scheduler below (xdist's module scheduler, told what a unit is) hands units out in
collection order: one to each worker, a second to each, then one more to whichever worker
finishes first. (xdist's own ``xdist_group`` mark does not take with pytest 9: it rewrites
a private node id attribute that pytest 9 no longer reads, and ``--dist loadgroup`` then
silently spreads a module's tests over workers.) Should xdist stop asking this file for
its scheduler, the run fails at its end rather than silently scheduling otherwise (see
:func:`pytest_sessionfinish`). Without xdist (``GEOREP_TEST_WORKERS=0``) only the order
changes.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: Node id prefixes (after ``tests/integration/``) of the tests that start Spark, by lane,
#: longest first within each.
LANES = {
    "spark-a": (
        "test_spark_audit.py",
        "test_georeceiver_sessions.py::test_fifty_sessions_keep_their_order_through_a_primary_failure[passive-outage]",
        "test_demo.py::test_the_pipeline_demo",
        "test_docs.py::test_the_python_in_each_doc_runs[audit.md]",
    ),
    "spark-b": (
        "test_spark_standalone.py",
        "test_spark_source.py",
        # Last, once lane a is done: beside the other lane's JVMs it ran three times slower
        # (moved to lane a to even the lanes out, it took 85 s instead of 33).
        "test_docs.py::test_the_python_in_each_doc_runs[spark.md]",
    ),
}

#: Modules whose tests are independent and each worth a worker of its own.
SPLIT = frozenset(
    {
        "test_classify_surface.py",
        "test_demo.py",
        "test_docs.py",
        "test_dropin_edges.py",
        "test_dropin_random.py",
        "test_emulator_faults.py",
        "test_emulator_messaging.py",
        "test_emulator_robustness.py",
        "test_fidelity_messaging.py",
        "test_georeceiver_sessions.py",
        "test_outbox_chaos.py",
    }
)

#: Modules whose tests with the same parameters form a unit each.
BY_PARAMETER = frozenset({"test_dropin_client.py", "test_dropin_client_sync.py"})

#: Seconds each unit took in a recent run (scripts/test_durations.py writes the file).
DURATIONS: dict[str, float] = json.loads(
    (Path(__file__).with_name("durations.json")).read_text(encoding="utf-8")
)

#: The guess for a unit missing from :data:`DURATIONS` (a new module): integration, unit.
GUESS = (10.0, 1.0)


#: The nice value a worker takes for the tests of any unit but a Spark lane (once taken,
#: kept: a process cannot lower its own nice value again without privilege).
BESIDE_LANES = 3

_niced = False


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under xdist: run every unit but a Spark lane at :data:`BESIDE_LANES`."""
    global _niced
    if _niced or "PYTEST_XDIST_WORKER" not in os.environ or unit_of(item.nodeid) in LANES:
        return
    _niced = True
    os.nice(BESIDE_LANES)


#: Units marked ``heavy`` out at once, besides the Spark lanes (GEOREP_TEST_HEAVY).
HEAVY_AT_ONCE = int(os.environ.get("GEOREP_TEST_HEAVY", "3"))

#: Where the workers tell the scheduler which units are heavy (set by the controller).
_UNITS_DIR = "GEOREP_TEST_UNITS_DIR"


def _short(nodeid: str) -> str:
    return nodeid.removeprefix("tests/integration/")


def _lane(nodeid: str) -> tuple[str, int] | None:
    for lane, prefixes in LANES.items():
        for position, prefix in enumerate(prefixes):
            if _short(nodeid).startswith(prefix):
                return lane, position
    return None


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its lane, its own node id (a module in
    :data:`SPLIT`), its module and parameters (:data:`BY_PARAMETER`), or its module's
    path."""
    lane = _lane(nodeid)
    if lane is not None:
        return lane[0]
    module = nodeid.split("::")[0]
    name = module.rsplit("/", 1)[-1]
    if name in BY_PARAMETER and nodeid.endswith("]"):
        return module + nodeid[nodeid.index("[") :]
    return nodeid if name in SPLIT or name in BY_PARAMETER else module


def _rank(unit: str, first: pytest.Item) -> tuple[int, float]:
    """The lanes first, then the other units longest first (:data:`DURATIONS`)."""
    if unit in LANES:
        return 0, 0.0
    guess = GUESS[0] if "integration" in first.path.parts else GUESS[1]
    return 1, -DURATIONS.get(unit, guess)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    units: dict[str, list[pytest.Item]] = {lane: [] for lane in LANES}
    for item in items:
        units.setdefault(unit_of(item.nodeid), []).append(item)
    for lane in LANES:  # a lane runs its tests in the order listed there
        units[lane].sort(key=lambda item: _lane(item.nodeid) or ("", 0))
    ordered = sorted(
        ((name, tests) for name, tests in units.items() if tests),
        key=lambda unit: _rank(unit[0], unit[1][0]),
    )  # stable: units of equal rank keep collection order
    items[:] = [item for _, tests in ordered for item in tests]
    _tell_heavy_units(units)
    _scale_timeouts(items)


def _tell_heavy_units(units: dict[str, list[pytest.Item]]) -> None:
    """In a worker: write the units holding a ``heavy`` test for the controller's
    scheduler (every worker collects the same; the last write wins, whole)."""
    directory = os.environ.get(_UNITS_DIR)
    if not directory or "PYTEST_XDIST_WORKER" not in os.environ:
        return
    heavy = sorted(
        name
        for name, tests in units.items()
        if name not in LANES and any(t.get_closest_marker("heavy") for t in tests)
    )
    path = os.path.join(directory, "heavy.json")
    partial = f"{path}.{os.environ['PYTEST_XDIST_WORKER']}"
    with open(partial, "w", encoding="utf-8") as out:
        json.dump(heavy, out)
    os.replace(partial, path)


#: Seconds a 2,000,000-step Python loop (in a function) takes on the machines the suite's
#: bounds were set on (0.03 s to 0.045 s): how much longer this machine takes is
#: :func:`pace` (0.135 s, a pace of 3, on one where the suite took 11 minutes, not 5).
REFERENCE_LOOP = 0.045

#: The most :func:`pace` scales a bound by (a hang must still end the run).
MAX_PACE = 5.0

_PACE = "GEOREP_TEST_PACE"


def _measured_pace() -> float:
    """This machine's Python speed against :data:`REFERENCE_LOOP` (best of three, so a
    moment's noise does not count), at least 1 and at most :data:`MAX_PACE`."""
    best = float("inf")
    for _ in range(3):
        started, total = time.perf_counter(), 0
        for step in range(2_000_000):
            total += step
        best = min(best, time.perf_counter() - started)
    return round(min(MAX_PACE, max(1.0, best / REFERENCE_LOOP)), 2)


def pace() -> float:
    """How much the suite's time bounds stretch on this machine (``GEOREP_TEST_PACE``, set
    by the controlling process before the workers start, or measured here): 1 on the
    machines the bounds were set on, 3 where Python runs three times slower (seen: a
    machine on which the whole suite took 12 minutes instead of 5, and a doc's 240 s bound
    and pytest-timeout's cut off runs that were slow, not stuck). Bounds that detect a hang
    scale with it; what a test asserts about time does not (timing belongs in benchmarks)."""
    if _PACE not in os.environ:
        os.environ[_PACE] = str(_measured_pace())
    return float(os.environ[_PACE])


def _scale_timeouts(items: list[pytest.Item]) -> None:
    """Stretch each test's pytest-timeout bound (its mark's, else the configured one) by
    :func:`pace`."""
    factor = pace()
    if factor <= 1.0:
        return
    for item in items:
        marker = item.get_closest_marker("timeout")
        args: tuple[Any, ...] = ()
        kwargs: dict[str, Any] = {}
        if marker is not None and (marker.args or "timeout" in marker.kwargs):
            seconds = marker.args[0] if marker.args else marker.kwargs["timeout"]
            args = marker.args[1:]
            kwargs = {k: v for k, v in marker.kwargs.items() if k != "timeout"}
        else:
            given = item.config.getoption("timeout", None)
            seconds = given if given is not None else item.config.getini("timeout")
        if seconds and float(seconds) > 0:
            stretched = pytest.mark.timeout(float(seconds) * factor, *args, **kwargs)
            item.add_marker(stretched, append=False)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        pace()  # measured once, on a quiet machine, and inherited by the workers
    if hasattr(config, "workerinput") or not config.getoption("dist_units", False):
        return
    import tempfile

    # Inherited by the workers, which xdist starts after this.
    os.environ[_UNITS_DIR] = tempfile.mkdtemp(prefix="georep-units-")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller removes the directory :func:`pytest_configure` made."""
    directory = os.environ.get(_UNITS_DIR)
    if directory and not hasattr(config, "workerinput"):
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
        del os.environ[_UNITS_DIR]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--dist-units",
        action="store_true",
        default=False,
        help="with -n: hand out georep's units of work (tests/conftest.py), longest first",
    )


_used: set[str] = set()
"""What of the unit scheduler ran in this (controlling) process: "made", "split"."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist-units``: hand out the units of :func:`unit_of`, in collection order
    (run with ``--no-loadscope-reorder``)."""
    if not config.getoption("dist_units"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        _heavy: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            _used.add("split")
            return unit_of(nodeid)

        def _heavy_units(self) -> frozenset[str]:
            if self._heavy is None:
                path = os.path.join(os.environ.get(_UNITS_DIR, ""), "heavy.json")
                try:
                    with open(path, encoding="utf-8") as units:
                        self._heavy = frozenset(json.load(units))
                except FileNotFoundError:
                    self._heavy = frozenset()
            return self._heavy

        def _heavy_out(self) -> int:
            heavy = self._heavy_units()
            return sum(
                1
                for work in self.assigned_work.values()
                for unit, tests in work.items()
                if unit in heavy and not all(tests.values())
            )

        def _assign_work_unit(self, node: Any) -> None:
            """The first unit in order, but while HEAVY_AT_ONCE heavy units are out, the
            first light one (a heavy one only when none is left: an xdist worker runs its
            last test only once it has another, or is shut down, so a node is never left
            without work)."""
            if self._heavy_out() >= HEAVY_AT_ONCE:
                heavy = self._heavy_units()
                light = next((u for u in self.workqueue if u not in heavy), None)
                if light is not None:
                    self.workqueue.move_to_end(light, last=False)
            super()._assign_work_unit(node)

    _used.add("made")
    return UnitScheduling(config, log)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a ``--dist-units`` run whose units were never handed out by the scheduler
    above (a pytest-xdist that stopped calling the hook would otherwise spread a module's
    Spark and emulator tests over every worker without a word)."""
    config = session.config
    if hasattr(config, "workerinput") or not config.getoption("dist_units"):
        return
    if not getattr(config.option, "numprocesses", None):
        return
    if not session.testscollected:
        return
    if {"made", "split"} - _used:
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        config.get_terminal_writer().line(
            "tests/conftest.py: --dist-units was given but pytest-xdist never used its "
            f"scheduler (ran: {sorted(_used) or 'nothing'}): the tests were not run in units",
            red=True,
        )


_SIGINT_AT_START = signal.getsignal(signal.SIGINT)


@pytest.fixture(autouse=True)
def _sigint_left_as_found(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test after which SIGINT's handler is no longer the one the process started
    with (an asyncio.Runner or loop signal handler left behind makes a later Ctrl-C cancel a
    task that is gone instead of raising KeyboardInterrupt), and put it back."""
    yield
    now = signal.getsignal(signal.SIGINT)
    if now is not _SIGINT_AT_START and not _live_spark_handler(now):
        signal.signal(signal.SIGINT, _SIGINT_AT_START)
        pytest.fail(
            f"{request.node.nodeid} left SIGINT's handler set to {now!r} "
            f"(it was {_SIGINT_AT_START!r}): restore it, e.g. close the asyncio.Runner or "
            "remove the loop's signal handler",
            pytrace=False,
        )


def _live_spark_handler(handler: Any) -> bool:
    """Whether ``handler`` is the one a SparkContext installs when it starts in the main
    thread (cancel its jobs, then KeyboardInterrupt) and that context still runs: a Spark
    lane's session lives as long as its worker. Left behind by a stopped context, it is a
    leak like any other."""
    if not getattr(handler, "__qualname__", "").startswith("SparkContext."):
        return False
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With ``GEOREP_CPU_REPORT=FILE``: append one JSON line per test with its unit, wall
    seconds and CPU seconds (this process and the children it has reaped, such as an
    emulator stopped at module teardown), to find what the two cores spend the suite on."""
    report = os.environ.get("GEOREP_CPU_REPORT")
    if not report:
        yield
        return
    start, wall, cpu, own = time.time(), time.monotonic(), _cpu_seconds(), time.process_time()
    yield
    line = {
        "test": item.nodeid,
        "unit": unit_of(item.nodeid),
        "start": round(start, 3),
        "pid": os.getpid(),
        "wall": round(time.monotonic() - wall, 3),
        "cpu": round(_cpu_seconds() - cpu, 3),
        "own": round(time.process_time() - own, 3),  # this process's alone
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
    }
    with open(report, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
