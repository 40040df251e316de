"""BrokerProcess: the lifecycle the demo, the CLI tests and the benchmarks rely on."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tierlog.cli.local_cluster import BrokerProcess, BrokerStartError, api_versions_answered, free_port


def test_broker_process_lifecycle(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "broker-1") as broker:
        assert broker.running
        assert broker.bootstrap == f"127.0.0.1:{broker.port}"
        assert (tmp_path / "broker-1" / "meta.properties").exists()

        # A paused broker keeps its socket but answers nothing, like a process stuck in a long pause.
        broker.pause()
        assert not api_versions_answered("127.0.0.1", broker.port, timeout_s=0.5)
        broker.resume()
        assert api_versions_answered("127.0.0.1", broker.port, timeout_s=5)

        first_pid = broker.pid
        broker.restart()
        assert broker.pid != first_pid
        assert api_versions_answered("127.0.0.1", broker.port, timeout_s=5)

        broker.kill()
        assert not broker.running
        assert broker.stop() == -signal.SIGKILL
        broker.start()
        broker.wait_ready(30)
    assert not broker.running
    assert (tmp_path / "broker-1.log").exists()


def test_stop_of_a_paused_broker_is_still_a_clean_shutdown(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "broker-1") as broker:
        broker.pause()
        assert broker.stop() == 0


def test_a_broker_that_cannot_start_fails_fast_with_its_log(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "broker-1", overrides={"num.partitions": "many"})
    broker.start()
    try:
        with pytest.raises(BrokerStartError, match=r"exited with code 1(.|\n)*num\.partitions"):
            broker.wait_ready(30)
    finally:
        broker.stop()


def test_nothing_answers_on_a_free_port() -> None:
    assert not api_versions_answered("127.0.0.1", free_port(), timeout_s=0.5)
