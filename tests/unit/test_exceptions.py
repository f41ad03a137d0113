"""Every georep error is also the SDK's class for that failure (issue 27).

An application that moves from azure-servicebus to georep keeps its ``except`` blocks: each
georep class is an instance of georep's hierarchy and of the SDK's matching class (or the
builtin the SDK raises). Each row below is the mapping the docs state; a class without a
row fails the first test.
"""

from __future__ import annotations

import inspect
import pickle

import azure.servicebus.exceptions as sdk
import pytest

import georep
import georep.exceptions as errors
from georep._classify import RETRYABLE_KINDS
from georep._sdk_errors import SDK_INSTALLED
from georep.ports import ErrorKind

KEY = "c2VjcmV0LWtleS1ub2JvZHktc2hvdWxkLXNlZQ=="
SIGNATURE = "b64sig%2Bvalue%3D"
CONNECTION_STRING = (
    "Endpoint=sb://east.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;"
    f"SharedAccessKey={KEY}"
)
SAS_TOKEN = (
    "SharedAccessSignature sr=sb%3a%2f%2feast.servicebus.windows.net%2forders"
    f"&sig={SIGNATURE}&se=1700000000&skn=send"
)

_CONNECTION = (sdk.ServiceBusConnectionError, sdk.ServiceBusCommunicationError)

# georep class -> (the SDK classes it also is, the builtins it also is).
MAPPING: dict[type[errors.GeoReplicationError], tuple[tuple[type, ...], tuple[type, ...]]] = {
    errors.RegionError: ((sdk.ServiceBusError,), ()),
    errors.RegionUnavailableError: (_CONNECTION, ()),
    errors.RegionTimeoutError: ((sdk.OperationTimeoutError, *_CONNECTION), ()),
    errors.ServerBusyError: ((sdk.ServiceBusServerBusyError, *_CONNECTION), ()),
    errors.AllRegionsUnavailableError: (_CONNECTION, ()),
    errors.MessageTooLargeError: ((sdk.MessageSizeExceededError,), (ValueError,)),
    errors.AuthenticationError: ((sdk.ServiceBusError,), (PermissionError,)),
    # Siblings, as the SDK's: its except branches for each get the one the SDK raises.
    errors.CredentialsRefusedError: ((sdk.ServiceBusAuthenticationError,), (PermissionError,)),
    errors.AccessDeniedError: ((sdk.ServiceBusAuthorizationError,), (PermissionError,)),
    errors.EntityNotFoundError: ((sdk.MessagingEntityNotFoundError,), (LookupError,)),
    errors.EntityDisabledError: (
        (sdk.MessagingEntityDisabledError, sdk.MessagingEntityNotFoundError),
        (LookupError,),
    ),
    errors.QuotaExceededError: ((sdk.ServiceBusQuotaExceededError,), ()),
    errors.LockLostError: ((sdk.MessageLockLostError, sdk.SessionLockLostError), ()),
    errors.InvalidArgumentError: ((sdk.ServiceBusError,), (ValueError,)),
    errors.MessageNotFoundError: ((sdk.MessageNotFoundError, sdk.ServiceBusError), (ValueError,)),
    errors.OutboxFullError: ((sdk.ServiceBusQuotaExceededError,), ()),
    errors.OutboxUnavailableError: ((sdk.ServiceBusError,), ()),
    errors.StoreUnavailableError: ((sdk.ServiceBusError,), ()),
    errors.SettlementError: ((), (ValueError, RuntimeError)),
    errors.AlreadySettledError: ((sdk.MessageAlreadySettled,), (ValueError, RuntimeError)),
    errors.ClosedError: ((), (ValueError, RuntimeError)),
    errors.ForkedProcessError: ((), (errors.ClosedError, ValueError, RuntimeError)),
    errors.InvalidMessageError: ((sdk.ServiceBusError,), (ValueError, TypeError)),
    errors.MessageExpiredError: ((sdk.ServiceBusError,), (ValueError, TypeError)),
    errors.OversizeMessageError: ((sdk.MessageSizeExceededError,), (ValueError, TypeError)),
    errors.ConfigurationError: ((), (ValueError,)),
    # Not a Service Bus operation: an application's `except ServiceBusError` must not hide
    # a broken emulator fixture.
    errors.EmulatorError: ((), (RuntimeError,)),
    errors.GeoReplicationError: ((), ()),
}

CLASSES = sorted(MAPPING, key=lambda cls: cls.__name__)


def _kind_of(cls: type[errors.RegionError]) -> ErrorKind:
    """The kind raised as ``cls``, or as its nearest base (a class more specific than its
    kind, such as MessageNotFoundError, chosen by the adapter)."""
    return next(
        kind for base in cls.__mro__ for kind in ErrorKind if errors.error_type(kind) is base
    )


def build(cls: type[errors.GeoReplicationError], text: str) -> errors.GeoReplicationError:
    """One instance of ``cls``, made the way georep makes it."""
    if issubclass(cls, errors.RegionError):
        return cls(text, region="primary", kind=_kind_of(cls))
    if cls is errors.AllRegionsUnavailableError:
        causes = {
            "primary": errors.region_error(
                f"primary: {text}", region="primary", kind=ErrorKind.CONNECTION
            ),
            "secondary": errors.region_error(
                "secondary: no answer", region="secondary", kind=ErrorKind.TIMEOUT
            ),
        }
        return errors.AllRegionsUnavailableError(text, causes)
    return cls(text)


def test_the_sdk_classes_are_the_sdks_own() -> None:
    # The dev install has the SDK, so georep's errors subclass its classes (a test in
    # test_layers.py covers the stand-ins).
    assert SDK_INSTALLED
    assert issubclass(errors.RegionError, sdk.ServiceBusError)


def test_every_georep_error_class_has_a_row() -> None:
    public = {
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    }
    assert public == set(MAPPING)
    exported = {getattr(georep, name) for name in georep.__all__}
    # Every class is exported from georep too, but the emulator's (georep.exceptions only).
    assert public - exported == {errors.EmulatorError}


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_each_error_is_georeps_and_the_sdks(cls: type[errors.GeoReplicationError]) -> None:
    sdk_classes, builtins = MAPPING[cls]
    error = build(cls, "it failed")
    assert isinstance(error, errors.GeoReplicationError)
    for expected in (*sdk_classes, *builtins):
        assert isinstance(error, expected), expected.__name__
        # `except` matches by inheritance alone (not isinstance hooks): raise and catch.
        with pytest.raises(expected):
            raise error
    if not sdk_classes:
        # A bad setting, a closed object, a wrong message or settlement call: the SDK
        # raises a builtin there, never a ServiceBusError (which callers may retry).
        assert not isinstance(error, sdk.ServiceBusError)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_each_error_has_the_sdks_attributes(cls: type[errors.GeoReplicationError]) -> None:
    cause = sdk.ServiceBusConnectionError(message="the link was detached")
    try:
        raise build(cls, "it failed") from cause
    except errors.GeoReplicationError as raised:
        error = raised
    assert error.message == str(error)
    assert error.inner_exception is cause
    assert error.exc_value is cause and error.exc_type is sdk.ServiceBusConnectionError
    assert error._retryable is error.retryable
    if isinstance(error, sdk.ServiceBusError):
        # Whatever a ServiceBusError the SDK builds carries, georep's has too.
        reference = sdk.ServiceBusError("x", error=cause)
        missing = [name for name in vars(reference) if not hasattr(error, name)]
        assert missing == []
    given = ValueError("given")
    if issubclass(cls, errors.RegionError):
        explicit = cls("x", region="primary", kind=_kind_of(cls), inner_exception=given)
    elif cls is errors.AllRegionsUnavailableError:
        explicit = errors.AllRegionsUnavailableError("x", {}, inner_exception=given)
    else:
        explicit = cls("x", inner_exception=given)
    assert explicit.inner_exception is given


def test_every_kind_raises_its_own_class_with_the_tables_retryable() -> None:
    for kind in ErrorKind:
        error = errors.region_error("x", region="secondary", kind=kind)
        assert type(error) is errors.error_type(kind)
        assert error.kind is kind and error.region == "secondary"
        assert error.retryable is (kind in RETRYABLE_KINDS)
    # The unavailable kinds are all RegionUnavailableError, as before.
    for kind in (ErrorKind.CONNECTION, ErrorKind.TIMEOUT, ErrorKind.SERVER_BUSY):
        assert isinstance(
            errors.region_error("x", region="p", kind=kind), georep.RegionUnavailableError
        )


def test_all_regions_unavailable_names_its_last_cause_when_not_raised_from_one() -> None:
    error = build(errors.AllRegionsUnavailableError, "no region accepted")
    assert isinstance(error, errors.AllRegionsUnavailableError)
    assert error.inner_exception is error.causes["secondary"]
    assert error.retryable


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_each_error_pickles(cls: type[errors.GeoReplicationError]) -> None:
    error = build(cls, "it failed")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error) and copy.message == error.message
    assert copy.retryable is error.retryable
    if isinstance(error, errors.RegionError):
        assert isinstance(copy, errors.RegionError)
        assert (copy.region, copy.kind) == (error.region, error.kind)
    if isinstance(error, errors.AllRegionsUnavailableError):
        assert isinstance(copy, errors.AllRegionsUnavailableError)
        assert {r: str(c) for r, c in copy.causes.items()} == {
            r: str(c) for r, c in error.causes.items()
        }


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_no_error_text_holds_a_secret(cls: type[errors.GeoReplicationError]) -> None:
    # georep builds messages from namespaces, never from a connection string: should one
    # reach an error anyway (a cause's text, a caller's argument), the error masks it.
    cause = ValueError(f"refused {CONNECTION_STRING} with {SAS_TOKEN}")
    try:
        raise build(cls, f"bad {CONNECTION_STRING} or {SAS_TOKEN}") from cause
    except errors.GeoReplicationError as raised:
        error = raised
    for text in (str(error), repr(error), error.message, error.exc_msg, str(error.args)):
        assert KEY not in text and SIGNATURE not in text
        assert "east.servicebus.windows.net" in text  # only the secret is masked


def test_placeholders_in_hints_are_not_masked() -> None:
    hint = "give 'Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...'"
    assert str(errors.ConfigurationError(hint)) == hint
