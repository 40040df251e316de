"""Fixtures the end-to-end security tests share: one set of test certificates per module, and brokers with a
PLAINTEXT listener next to the secured listeners under test, stopped (their log's tail printed) at the module's
end."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import pytest
from tls_helpers import ListenersBroker, TlsFiles, make_tls_files

BROKER_STOP_TIMEOUT_S = 15.0


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def listeners_broker_factory(
    tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[tuple[str, ...], Mapping[str, str]], ListenersBroker]]:
    """Starts a ready `ListenersBroker` with the module's certificates; every one is stopped at the end."""
    started: list[ListenersBroker] = []

    def start(listeners: tuple[str, ...], overrides: Mapping[str, str]) -> ListenersBroker:
        broker = ListenersBroker(tmp_path_factory.mktemp("broker") / "data", tls_files, listeners, overrides)
        started.append(broker)
        broker.start()
        broker.wait_ready()
        return broker

    yield start
    for broker in started:
        try:
            broker.stop(BROKER_STOP_TIMEOUT_S)
        finally:
            print(f"\n---- last lines of {broker.log_file} ----\n{broker.log_tail(60)}")
