"""InMemoryLedger: the Ledger port in lists, for unit tests (re-exported by georep.testing)."""

from __future__ import annotations

__all__ = ["InMemoryLedger"]

from collections.abc import Callable
from typing import Any

from georep.ledger.parquet import receive_rows, send_rows
from georep.ports import ReceiveRecord, SendRecord


class InMemoryLedger:
    """Keeps every record; :attr:`send_rows`/:attr:`receive_rows` give the rows as the
    Parquet files would hold them (one per message id, timestamps as UTC datetimes).

    Attributes:
        sends: Send records, in the order recorded.
        receives: Receive records, in the order recorded.
        flushes: How many times :meth:`flush` was called.
        closed: :meth:`aclose` was called.
    """

    process_id = 1
    host = "test-host"

    def __init__(self) -> None:
        self.sends: list[SendRecord] = []
        self.receives: list[ReceiveRecord] = []
        self.flushes = 0
        self.closed = False

    def record_send(self, record: SendRecord) -> None:
        self.sends.append(record)

    def record_receive(self, record: ReceiveRecord) -> None:
        self.receives.append(record)

    @property
    def send_rows(self) -> list[dict[str, Any]]:
        return self._rows(self.sends, send_rows)

    @property
    def receive_rows(self) -> list[dict[str, Any]]:
        return self._rows(self.receives, receive_rows)

    def _rows(
        self, records: list[Any], to_rows: Callable[..., list[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        return [
            row
            for record in records
            for row in to_rows(record, process_id=self.process_id, host=self.host)
        ]

    async def flush(self) -> None:
        self.flushes += 1

    async def aclose(self) -> None:
        self.closed = True
