"""The control endpoint's fault table: every kind a row, every refusal a clear message.

``inject_fault`` is what ``POST /namespaces/{ns}/faults/{fault}`` runs; these tests call it
on a namespace server that never listens (the faults that stop or start listening are
covered against a running emulator in tests/integration/test_emulator_faults.py).
"""

from __future__ import annotations

import ssl
from typing import Any

import pytest

from georep.adapters.emulator._control import (
    FAULTS,
    Argument,
    FaultKind,
    FaultRefused,
    inject_fault,
)
from georep.adapters.emulator._faults import Faults
from georep.adapters.emulator._relay import RelayServer
from georep.adapters.emulator._server import NamespaceServer, NamespaceSpec

NO_FAULTS = Faults().as_dict()
FRAGMENT = "{'entity': <name>, 'index': <0..15>}"


@pytest.fixture
def server() -> NamespaceServer:
    spec = NamespaceSpec(name="primary", queues=("q",), session_queues=("s",))
    server = NamespaceServer(spec, ssl_context=None, admin_handler=None)
    server.relay = RelayServer(
        server,
        ssl_context=ssl.create_default_context(ssl.Purpose.CLIENT_AUTH),
        hybrid_connections=("svc",),
    )
    return server


async def refusal(server: NamespaceServer, fault: str, body: dict[str, Any]) -> FaultRefused:
    with pytest.raises(FaultRefused) as info:
        await inject_fault(server, fault, body)
    return info.value


async def test_an_unknown_fault_is_refused_naming_every_known_one(server: NamespaceServer) -> None:
    refused = await refusal(server, "meteor", {})
    assert refused.status == 404
    assert refused.message == (
        "unknown fault 'meteor'; one of outage, restore, blackhole, latency, reject-sends, "
        "drop-dispositions, lose-settlements, disaster, fragment-down, fragment-up, "
        "session-lock-lost, relay-no-listener"
    )


@pytest.mark.parametrize(
    ("fault", "body", "message"),
    [
        ("latency", {}, "latency needs {'seconds': <number >= 0>}"),
        ("latency", {"seconds": "soon"}, "latency needs {'seconds': <number >= 0>}"),
        ("latency", {"seconds": None}, "latency needs {'seconds': <number >= 0>}"),
        ("latency", {"seconds": -0.5}, "latency seconds must be >= 0"),
        ("drop-dispositions", {}, "drop-dispositions needs {'count': <int >= 0>}"),
        ("drop-dispositions", {"count": -2}, "drop-dispositions count must be >= 0"),
        ("lose-settlements", {}, "lose-settlements needs {'count': <int >= 0>}"),
        (
            "reject-sends",
            {"condition": "meteor"},
            "reject-sends condition must be one of "
            "['internal-error', 'quota-exceeded', 'server-busy', 'timeout'] or null",
        ),
        (
            "reject-sends",
            {"condition": ["server-busy"]},
            "reject-sends condition must be one of "
            "['internal-error', 'quota-exceeded', 'server-busy', 'timeout'] or null",
        ),
        ("fragment-down", {"entity": "q"}, f"fragment-down needs {FRAGMENT}"),
        ("fragment-up", {"entity": 3, "index": 1}, f"fragment-up needs {FRAGMENT}"),
        ("fragment-up", {"entity": "q", "index": "1"}, f"fragment-up needs {FRAGMENT}"),
        ("session-lock-lost", {}, "session-lock-lost needs {'entity': <queue or subscription>}"),
        ("relay-no-listener", {"on": 0}, "relay-no-listener needs {'path': <hybrid connection>}"),
    ],
)
async def test_a_missing_or_invalid_argument_is_refused_and_changes_nothing(
    server: NamespaceServer, fault: str, body: dict[str, Any], message: str
) -> None:
    refused = await refusal(server, fault, body)
    assert (refused.status, refused.message) == (400, message)
    assert server.faults.as_dict() == NO_FAULTS
    assert server.relay is not None and server.relay.no_listener == set()


async def test_the_answer_is_the_namespaces_faults_after_the_fault(
    server: NamespaceServer,
) -> None:
    assert (await inject_fault(server, "latency", {"seconds": 0.25}))["latency"] == 0.25
    assert (await inject_fault(server, "latency", {"seconds": "1"}))["latency"] == 1.0
    assert (await inject_fault(server, "drop-dispositions", {"count": 3}))[
        "dropped_dispositions"
    ] == 3
    state = await inject_fault(server, "reject-sends", {"condition": "server-busy"})
    assert state == {
        **NO_FAULTS,
        "latency": 1.0,
        "dropped_dispositions": 3,
        "reject_sends": "server-busy",
    }
    assert server.faults.reject_condition()[0] == "com.microsoft:server-busy"
    # No condition (or null) stops rejecting.
    assert (await inject_fault(server, "reject-sends", {}))["reject_sends"] is None
    assert (await inject_fault(server, "blackhole", {}))["blackhole"] is True


async def test_a_broker_refusal_keeps_its_status_and_description(server: NamespaceServer) -> None:
    missing = await refusal(server, "fragment-down", {"entity": "nowhere", "index": 1})
    assert missing.status == 404 and "'nowhere' could not be found" in missing.message
    unpartitioned = await refusal(server, "fragment-up", {"entity": "q", "index": 1})
    assert unpartitioned.status == 400 and "partition" in unpartitioned.message
    sessionless = await refusal(server, "session-lock-lost", {"entity": "q"})
    assert sessionless.status == 400 and "is not session-enabled" in sessionless.message


async def test_session_lock_lost_adds_how_many_locks_were_held(server: NamespaceServer) -> None:
    state = await inject_fault(server, "session-lock-lost", {"entity": "s"})
    assert state == {**NO_FAULTS, "session_locks_lost": 0}


async def test_relay_no_listener_toggles_a_known_hybrid_connection(
    server: NamespaceServer,
) -> None:
    assert server.relay is not None
    unknown = await refusal(server, "relay-no-listener", {"path": "other"})
    assert (unknown.status, unknown.message) == (
        404,
        "no hybrid connection 'other' in this namespace",
    )
    await inject_fault(server, "relay-no-listener", {"path": "svc"})
    assert server.relay.no_listener == {"svc"}
    await inject_fault(server, "relay-no-listener", {"path": "svc", "on": False})
    assert server.relay.no_listener == set()


async def test_a_new_fault_is_one_row(
    server: NamespaceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def slow(target: NamespaceServer, arguments: dict[str, Any]) -> dict[str, Any]:
        target.faults.latency = arguments["ms"] / 1000
        return {"unit": arguments["unit"]}

    row = FaultKind(
        slow,
        (
            Argument("ms", "<int>", int),
            Argument("unit", "<text>", str, required=False, default="ms"),
        ),
    )
    monkeypatch.setitem(FAULTS, "slow-ms", row)
    assert await inject_fault(server, "slow-ms", {"ms": 250}) == {
        **NO_FAULTS, "latency": 0.25, "unit": "ms"
    }  # fmt: skip
    refused = await refusal(server, "slow-ms", {"unit": "s"})
    assert (refused.status, refused.message) == (400, "slow-ms needs {'ms': <int>}")
    assert "slow-ms" in (await refusal(server, "meteor", {})).message
