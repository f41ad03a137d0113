"""Shared fixtures: one emulator for the session, a fresh queue per test; a private emulator
per module for modules whose tests inject faults; a Redis seen-set per test. Shared plain
functions are in ``_helpers.py``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from typing import Any

import pytest
from _helpers import REDIS_URL, create_queue, fresh_redis_cluster
from azure.servicebus.aio import ServiceBusClient

from georep.adapters.emulator import Emulator
from georep.adapters.redis import PrivateRedisCluster, RedisSeenSet

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


@pytest.fixture(scope="session")
def _faults_emulator() -> Iterator[list[Emulator]]:
    """The emulator :func:`emu` lends out in this worker (in a list: replaced when gone)."""
    held: list[Emulator] = []
    yield held
    for emulator in held:
        emulator.stop()


@pytest.fixture(scope="module")
def emu(_faults_emulator: list[Emulator]) -> Iterator[Emulator]:
    """A two-region emulator apart from the session's, for a module whose tests inject
    faults (which must not reach the session's emulator): one per worker, lent to one
    module at a time (a worker runs one test at a time), with every fault lifted when the
    module is done, and started again should a module have stopped it. Each start costs
    about half a CPU-second, and the suite's modules and units asked for over a hundred.
    Tests name their entities uniquely, as everywhere in the suite."""
    if _faults_emulator and not _faults_emulator[0].running:
        _faults_emulator.pop().stop()
    if not _faults_emulator:
        emulator = Emulator()
        emulator.start()
        _faults_emulator.append(emulator)
    emulator = _faults_emulator[0]
    yield emulator
    if emulator.running:
        for namespace in emulator.namespaces:
            emulator.namespace(namespace).restore()


@pytest.fixture
def private_queue(emu: Emulator) -> Iterator[Callable[..., str]]:
    """``private_queue(prefix, **properties)`` creates a uniquely named queue in every
    namespace of the module's emulator; every fault is lifted after the test."""

    yield partial(create_queue, emu)
    for namespace in emu.namespaces:
        emu.namespace(namespace).restore()


@pytest.fixture
async def emu_client(emu: Emulator) -> AsyncIterator[ServiceBusClient]:
    """The SDK's async client on the module's private emulator (primary), without retries:
    a fault the test injects shows at once."""
    async with ServiceBusClient.from_connection_string(
        emu.connection_string("primary"), retry_total=0
    ) as sb:
        yield sb


@pytest.fixture
async def seen() -> AsyncIterator[RedisSeenSet]:
    """A Redis seen-set with default options but a group of its own (tests never see each
    other's keys), closed after the test."""
    group = f"test-{uuid.uuid4().hex[:8]}"
    async with RedisSeenSet.from_url(REDIS_URL, group=group, window=600) as store:
        yield store


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[PrivateRedisCluster]:
    """A Redis Cluster of our own (3 masters, 3 replicas, on free loopback ports), shared by
    the session's tests that only read and write it; torn down at the end. Skips the test
    when ``redis-server`` and ``redis-cli`` are not installed."""
    yield from fresh_redis_cluster()
