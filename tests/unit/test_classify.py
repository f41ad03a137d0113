"""The one classification table: every SDK exception -> kind -> fails over or not."""

from __future__ import annotations

import inspect
from typing import Any

import azure.servicebus.exceptions as sdk
import pytest

from georep import DEFAULT_FAILOVER_KINDS, ErrorKind, GeoSender, RegionError
from georep._classify import (
    CLASSIFICATION,
    PAIRED_FAILOVER_KINDS,
    RETRYABLE_KINDS,
    UNAVAILABLE_KINDS,
    every_region_refused,
)
from georep.adapters.servicebus._errors import translate_error
from georep.exceptions import ClosedError, RegionUnavailableError, region_error
from georep.relay.channel import DEFAULT_RELAY_FAILOVER_KINDS
from georep.testing import FakeMessage, InMemoryOutbox, InMemoryRegionSender

_INTERNAL = {"condition": b"amqp:internal-error", "retryable": True}

# (exception, kind, fails over by default). One row per class in azure.servicebus.exceptions.
CASES: list[tuple[BaseException, ErrorKind, bool]] = [
    (sdk.ServiceBusConnectionError(message="x"), ErrorKind.CONNECTION, True),
    (sdk.ServiceBusCommunicationError(message="x"), ErrorKind.CONNECTION, True),
    (sdk.OperationTimeoutError(message="x"), ErrorKind.TIMEOUT, True),
    (sdk.ServiceBusServerBusyError(message="x"), ErrorKind.SERVER_BUSY, True),
    (sdk.ServiceBusAuthenticationError(message="x"), ErrorKind.AUTHENTICATION, False),
    (sdk.ServiceBusAuthorizationError(message="x"), ErrorKind.AUTHENTICATION, False),
    (sdk.MessageSizeExceededError(message="x"), ErrorKind.MESSAGE_TOO_LARGE, False),
    (sdk.MessagingEntityNotFoundError(message="x"), ErrorKind.ENTITY_NOT_FOUND, False),
    (sdk.MessagingEntityDisabledError(message="x"), ErrorKind.ENTITY_DISABLED, False),
    (sdk.MessagingEntityAlreadyExistsError(message="x"), ErrorKind.INVALID_ARGUMENT, False),
    (sdk.ServiceBusQuotaExceededError(message="x"), ErrorKind.QUOTA_EXCEEDED, False),
    (sdk.MessageLockLostError(message="x"), ErrorKind.LOCK_LOST, False),
    (sdk.SessionLockLostError(message="x"), ErrorKind.LOCK_LOST, False),
    (sdk.MessageNotFoundError(message="x"), ErrorKind.INVALID_ARGUMENT, False),
    (sdk.MessageAlreadySettled(action="complete"), ErrorKind.INVALID_ARGUMENT, False),
    (sdk.SessionCannotBeLockedError(message="x"), ErrorKind.SERVICE_ERROR, False),
    (sdk.AutoLockRenewFailed("x"), ErrorKind.LOCK_LOST, False),
    (sdk.AutoLockRenewTimeout("x"), ErrorKind.LOCK_LOST, False),
    # The plain ServiceBusError: a service failure the SDK marks retryable...
    (sdk.ServiceBusError("internal", **_INTERNAL), ErrorKind.SERVICE_ERROR, False),
    # ... an argument error (which the SDK also marks retryable) ...
    (
        sdk.ServiceBusError(
            "bad", condition=b"com.microsoft:argument-out-of-range", retryable=True
        ),
        ErrorKind.INVALID_ARGUMENT,
        False,
    ),
    # ... a condition the SDK does not retry ...
    (
        sdk.ServiceBusError("no", condition=b"amqp:not-allowed", retryable=False),
        ErrorKind.INVALID_ARGUMENT,
        False,
    ),
    # ... and a failure inside the client: a message id that is not valid UTF-8.
    (
        sdk.ServiceBusError(
            "Handler failed: 'utf-8' codec can't encode",
            error=UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed"),
        ),
        ErrorKind.INVALID_ARGUMENT,
        False,
    ),
    (ConnectionResetError("reset"), ErrorKind.CONNECTION, True),
    (TimeoutError(), ErrorKind.TIMEOUT, True),
]


def test_every_sdk_exception_class_has_a_row() -> None:
    classes = {
        obj
        for _, obj in inspect.getmembers(sdk, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == sdk.__name__
    }
    assert classes <= {type(exc) for exc, _, _ in CASES}


def test_every_kind_has_a_row_in_the_table() -> None:
    assert set(CLASSIFICATION) == set(ErrorKind)


# SDK classes whose kind is broader than they are: the georep error is still a
# ServiceBusError (and a ValueError for the argument kind), not that class itself.
_BROADER_KIND = {
    sdk.MessagingEntityAlreadyExistsError,
    sdk.MessageAlreadySettled,
    sdk.SessionCannotBeLockedError,
    sdk.AutoLockRenewFailed,
    sdk.AutoLockRenewTimeout,
}


@pytest.mark.parametrize(
    ("exc", "kind"),
    [(exc, kind) for exc, kind, _ in CASES if isinstance(exc, sdk.ServiceBusError | ValueError)],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_a_translated_sdk_exception_is_still_caught_by_its_sdk_class(
    exc: BaseException, kind: ErrorKind
) -> None:
    error = translate_error(exc, region="primary", namespace="east.example")
    assert error is not None and error.inner_exception is exc
    if type(exc) in _BROADER_KIND:
        assert isinstance(error, sdk.ServiceBusError)
        assert isinstance(error, ValueError) is (kind is ErrorKind.INVALID_ARGUMENT)
    else:
        assert isinstance(error, type(exc)), f"{type(error).__name__} is no {type(exc).__name__}"


def test_a_georep_error_is_not_translated_again() -> None:
    lost = region_error("primary: lock lost", region="primary", kind=ErrorKind.LOCK_LOST)
    assert translate_error(lost, region="primary", namespace="east.example") is lost
    closed = ClosedError("the adapter is closed")
    # A ClosedError is a ValueError, which the SDK raises for bad arguments: it stays as it is.
    assert translate_error(closed, region="primary", namespace="east.example") is None


@pytest.mark.parametrize(
    ("exc", "kind", "fails_over"),
    CASES,
    ids=[type(c[0]).__name__ + str(i) for i, c in enumerate(CASES)],
)
async def test_sdk_exception_kind_and_failover(
    exc: BaseException, kind: ErrorKind, fails_over: bool
) -> None:
    error = translate_error(exc, region="primary", namespace="east.example")
    assert error is not None and error.kind is kind
    assert isinstance(error, RegionUnavailableError) is fails_over
    assert error.retryable is (kind in RETRYABLE_KINDS)

    # Through a GeoSender: the primary fails with that kind.
    primary = InMemoryRegionSender("primary", "east.example", "orders")
    secondary = InMemoryRegionSender("secondary", "west.example", "orders")
    outbox = InMemoryOutbox()
    sender = GeoSender(primary, secondary, outbox=outbox)
    primary.fail_with(kind)
    try:
        if fails_over:
            result = await sender.send_messages(FakeMessage(b"x"))
            assert result.failed_over and len(secondary.accepted) == 1
        else:
            with pytest.raises(RegionError) as raised:
                await sender.send_messages(FakeMessage(b"x"))
            assert raised.value.kind is kind
            # Raised at once: the other region never tried, roles unchanged, not queued.
            assert secondary.attempts == 0 and sender.active_region == "primary"
            assert await outbox.depth() == 0
    finally:
        await sender.aclose()


def test_every_consumer_reads_the_one_table() -> None:
    from georep._policy import FailoverPolicy
    from georep.paired import sender as _paired_sender, syphon as _syphon

    assert DEFAULT_FAILOVER_KINDS == UNAVAILABLE_KINDS
    assert FailoverPolicy().fail_over_on == UNAVAILABLE_KINDS
    assert {ErrorKind.CONNECTION, ErrorKind.TIMEOUT, ErrorKind.SERVER_BUSY} == UNAVAILABLE_KINDS
    # SPEC §3: the paired timer ignores auth and server-busy.
    assert ErrorKind.SERVER_BUSY not in PAIRED_FAILOVER_KINDS
    assert ErrorKind.AUTHENTICATION not in PAIRED_FAILOVER_KINDS
    assert UNAVAILABLE_KINDS <= DEFAULT_RELAY_FAILOVER_KINDS
    source: Any = inspect.getsource(_paired_sender) + inspect.getsource(_syphon)
    assert "frozenset(\n    {ErrorKind" not in source, "a private copy of the table is back"


def test_the_sdks_closed_handler_is_a_connection_failure_and_other_value_errors_are_not() -> None:
    """A receiver closing during an outage hands back what it holds after the SDK closed its
    link: its ValueError ("The handler has already been shutdown...") is not a wrong
    request, and saying "fix it and send again" misled (issue 27)."""
    closed = ValueError(
        "Failed to abandon the message as the handler has already been shutdown."
        "Please use ServiceBusClient to create a new instance."
    )
    shut = translate_error(closed, region="primary", namespace="east")
    assert shut is not None and shut.kind is ErrorKind.CONNECTION
    assert "fix it and send again" not in str(shut)
    wrong = translate_error(ValueError("bad id"), region="primary", namespace="east")
    assert wrong is not None and wrong.kind is ErrorKind.INVALID_ARGUMENT


def test_a_refusal_of_every_region_is_raised_as_a_copy_that_holds_no_caller() -> None:
    """What each region last answered is kept; the error raised from it is a fresh copy of
    the primary's, so raising it again and again neither chains the callers' frames to
    the kept one nor shares one object between callers."""
    refusals = [
        region_error("wrong key", region=label, kind=ErrorKind.AUTHENTICATION)
        for label in ("primary", "secondary")
    ]

    def caller() -> None:
        refusal = every_region_refused(refusals)
        assert refusal is not None
        raise refusal

    raised = []
    for _ in range(2):
        with pytest.raises(sdk.ServiceBusAuthenticationError) as info:
            caller()
        raised.append(info.value)
    first, second = raised
    assert first is not second and first is not refusals[0]
    assert (type(first), str(first), first.region, first.kind) == (
        type(refusals[0]),
        str(refusals[0]),
        "primary",
        ErrorKind.AUTHENTICATION,
    )
    assert refusals[0].__traceback__ is None, "the kept error holds no caller's frames"

    outage = region_error("down", region="secondary", kind=ErrorKind.CONNECTION)
    assert every_region_refused([refusals[0], outage]) is None, "one region is only down"
    assert every_region_refused([refusals[0], None]) is None, "one region answers"
    assert every_region_refused([]) is None
