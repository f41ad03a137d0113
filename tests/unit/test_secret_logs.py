"""No key reaches a line georep logs, whoever wrote the text (an application handler's
exception, an SDK error): every georep logger masks it."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import georep  # noqa: F401  (importing georep puts the mask on its loggers)
from georep._secrets import LOGGERS, SecretMask

ROOT = Path(__file__).resolve().parents[2]
KEY = "Fu/gfyzEE5qNJPpZn6Lq5/mGJeJF9iRdL1cA3x+JmZ8="
CONNECTION = (
    f"Endpoint=sb://127.0.0.1:33513;SharedAccessKeyName=Root;SharedAccessKey={KEY};"
    "UseDevelopmentEmulator=true"
)


def test_every_logger_georep_names_is_masked() -> None:
    named = set()
    for path in [*ROOT.joinpath("georep").rglob("*.py"), *ROOT.joinpath("adapters").rglob("*.py")]:
        named |= set(re.findall(r'getLogger\("(georep[^"]*)"\)', path.read_text()))
    assert named and named <= set(LOGGERS), sorted(named - set(LOGGERS))


@pytest.mark.parametrize("name", ["georep.receiver", "georep.sender", "georep"])
def test_a_key_in_a_logged_argument_or_traceback_is_masked(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # What the receiver logs when a handler raises with a connection string in its text.
    logger = logging.getLogger(name)
    with caplog.at_level(logging.WARNING, logger=name):
        logger.warning("handler failed for %s: %r", "x1", ConnectionError(f"db: {CONNECTION}"))
        try:
            raise RuntimeError(f"could not write using {CONNECTION}")
        except RuntimeError:
            logger.exception("the fetcher failed")
    text = "\n".join(caplog.messages) + caplog.text
    assert KEY not in text
    assert "SharedAccessKey=***" in text and "handler failed for x1" in text


def test_a_record_whose_arguments_do_not_fit_its_format_passes_the_mask_unchanged() -> None:
    # The mask must not raise into the code that logs: the handler reports such a record
    # (logging's own way), as it would without the mask.
    record = logging.LogRecord(
        "georep.receiver", logging.WARNING, __file__, 1, "%d copies", ("x",), None
    )
    assert SecretMask().filter(record)
    assert (record.msg, record.args) == ("%d copies", ("x",))


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("db login failed: postgres://app:Pa55w0rd@db/prod", "postgres://app:***@db/prod"),
        ("redis://:Pa55w0rd@127.0.0.1:6379/0 refused", "redis://:***@127.0.0.1:6379/0"),
        ("http://host:8080/path and amqps://user@host:5671", None),
    ],
)
def test_a_url_password_in_a_handlers_error_is_masked(
    text: str, shown: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """The receiver logs a failed handler's exception (receiver.md §7 keeps its text out of
    dead-letter descriptions for the secrets it may hold): a URL's password is masked."""
    with caplog.at_level(logging.WARNING, logger="georep.receiver"):
        logging.getLogger("georep.receiver").warning("handler failed: %r", RuntimeError(text))
    assert "Pa55w0rd" not in caplog.text
    assert (shown or text) in caplog.text, "ports, paths and user names stay"
