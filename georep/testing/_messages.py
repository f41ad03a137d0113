"""Fake messages and their codec, for :class:`georep.testing.InMemoryRegionSender`."""

from __future__ import annotations

__all__ = ["FakeBatch", "FakeCodec", "FakeMessage"]

import base64
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from georep.exceptions import InvalidMessageError, OversizeMessageError


@dataclass
class FakeMessage:
    """A message for :class:`InMemoryRegionSender`: a body and the fields georep reads."""

    body: bytes = b""
    message_id: str | None = None
    subject: str | None = None
    application_properties: dict[str, Any] = field(default_factory=dict)
    time_to_live: float | None = None
    """Seconds, or None for no time-to-live."""
    session_id: str | None = None


class FakeBatch:
    """A batch of :class:`FakeMessage` built by :meth:`FakeCodec.new_batch`."""

    def __init__(self, max_size_in_bytes: int, prepare: Callable[[Any], object]) -> None:
        self.max_size_in_bytes = max_size_in_bytes
        self.messages: list[FakeMessage] = []
        self.ids: list[str] = []
        self.size_in_bytes = 0
        self._prepare = prepare

    def add_message(self, message: FakeMessage) -> None:
        size = len(message.body)
        if self.size_in_bytes + size > self.max_size_in_bytes:
            raise OversizeMessageError(f"batch is full ({self.max_size_in_bytes} bytes)")
        self.ids.append(str(self._prepare(message)))
        self.messages.append(message)
        self.size_in_bytes += size

    def __len__(self) -> int:
        return len(self.messages)


class FakeCodec:
    """The :class:`georep.ports.MessageCodec` for :class:`FakeMessage`."""

    def split(self, messages: Any) -> list[Any]:
        if isinstance(messages, FakeMessage):
            return [messages]
        if isinstance(messages, FakeBatch):
            return list(messages.messages)
        if isinstance(messages, Iterable) and not isinstance(messages, str | bytes):
            items = list(messages)
            if all(isinstance(item, FakeMessage) for item in items):
                return items
        raise InvalidMessageError(f"cannot send a {type(messages).__name__}")

    def is_batch(self, messages: Any) -> bool:
        return isinstance(messages, FakeBatch)

    def message_id(self, message: Any) -> str | None:
        return message.message_id  # type: ignore[no-any-return]

    def set_message_id(self, message: Any, message_id: str) -> None:
        message.message_id = message_id

    def subject(self, message: Any) -> str | None:
        return message.subject  # type: ignore[no-any-return]

    def session_id(self, message: Any) -> str | None:
        return message.session_id  # type: ignore[no-any-return]

    def application_property(self, message: Any, name: str) -> Any:
        return message.application_properties.get(name)

    def set_application_property(self, message: Any, name: str, value: str) -> None:
        message.application_properties[name] = value

    def time_to_live(self, message: Any) -> float | None:
        return message.time_to_live  # type: ignore[no-any-return]

    def set_time_to_live(self, message: Any, seconds: float) -> None:
        message.time_to_live = seconds

    def copy(self, message: Any) -> Any:
        return FakeMessage(
            message.body,
            message.message_id,
            message.subject,
            dict(message.application_properties),
            message.time_to_live,
            message.session_id,
        )

    def encode(self, message: Any) -> bytes:
        return json.dumps(
            {
                "body": base64.b64encode(message.body).decode(),
                "message_id": message.message_id,
                "subject": message.subject,
                "application_properties": message.application_properties,
                "time_to_live": message.time_to_live,
                "session_id": message.session_id,
            }
        ).encode()

    def decode(self, payload: bytes) -> Any:
        document = json.loads(payload)
        return FakeMessage(
            base64.b64decode(document["body"]),
            document["message_id"],
            document["subject"],
            document["application_properties"],
            document.get("time_to_live"),
            document.get("session_id"),
        )

    def check(
        self, messages: Sequence[Any], *, one_partition: bool, max_size: int | None = None
    ) -> None:
        if max_size is not None and sum(len(m.body) for m in messages) > max_size:
            what = (
                f"message {self.message_id(messages[0])!r} is"
                if len(messages) == 1
                else f"{len(messages)} messages together are"
            )
            raise OversizeMessageError(f"{what} over the entity's limit of {max_size} bytes")
        # FakeMessage has no partition key.

    def prepared_ids(
        self, payload: Any, *, one_partition: bool, max_size: int | None = None
    ) -> tuple[str, ...] | None:
        if not isinstance(payload, FakeBatch) or (
            max_size is not None and payload.size_in_bytes > max_size
        ):
            return None
        return tuple(payload.ids)  # FakeMessage has no partition key

    def new_batch(self, max_size_in_bytes: int, prepare: Callable[[Any], object]) -> Any:
        return FakeBatch(max_size_in_bytes, prepare)
