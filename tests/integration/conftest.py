"""Shared fixtures: one emulator for the session, a fresh queue per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from azure.servicebus.aio import ServiceBusClient

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration


@pytest.fixture
def make_queue(georep_emulator: Emulator) -> Callable[..., str]:
    """Create a uniquely named queue in every namespace and return its name."""

    def create(**properties: Any) -> str:
        name = f"q-{uuid.uuid4().hex[:10]}"
        for namespace in georep_emulator.namespaces:
            georep_emulator.namespace(namespace).create_queue(name, **properties)
        return name

    return create


@pytest.fixture
def queue(make_queue: Callable[..., str]) -> str:
    return make_queue()


@pytest.fixture
async def client(georep_emulator: Emulator) -> AsyncIterator[ServiceBusClient]:
    async with ServiceBusClient.from_connection_string(
        georep_emulator.connection_string("primary")
    ) as sb:
        yield sb
