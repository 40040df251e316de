"""Jepsen-style history checking: the checker finds every anomaly it names (on hand-made histories), the
proxy really cuts links, and a real 3-broker cluster whose brokers are the 3 voters of the controller quorum,
under a seeded nemesis (SIGKILL, SIGSTOP, isolation from the quorum, aimed at the active controller or any
voter; cut replication links), keeps a valid history for real librdkafka producers and consumers while the
quorum elects new leaders."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from tierlog.faults.checker import History, Send, check
from tierlog.faults.proxy import FaultProxy
from tierlog.faults.workload import ACTIVE_CONTROLLER, controller_failovers, fault_run

FAULT_SECONDS = 40
# Its schedule holds within 40 s every kind of fault, on any voter and on the active controller: isolated, killed
# and paused long enough for the other voters to elect a leader meanwhile.
SEED = 330


def history(**parts: object) -> History:
    h = History(final={0: [(0, "a"), (1, "b"), (2, "c")]})
    for name, value in parts.items():
        setattr(h, name, value)
    return h


def acked(value: str, offset: int, idempotent: bool = True) -> Send:
    return Send(value, idempotent, "ok", 0, offset)


def failing(h: History) -> dict[str, int]:
    return {kind: count for kind, count in check(h).counts.items() if count}


def test_a_valid_history_has_no_anomaly() -> None:
    h = history(
        sends=[acked("a", 0), acked("b", 1), Send("x", True, "failed")], polls={"c": [(0, 0, "a"), (0, 1, "b")]}
    )
    verdict = check(h)
    assert verdict.ok, verdict.summary()
    assert verdict.stats["acknowledged"] == 2 and verdict.stats["failed"] == 1


def test_an_acknowledged_value_missing_from_the_log_is_a_lost_write() -> None:
    assert failing(history(sends=[acked("z", 3)])) == {"lost writes": 1}


def test_a_value_acknowledged_without_an_offset_must_still_be_in_the_log() -> None:
    verdict = check(history(sends=[acked("b", -1), acked("z", -1)]))
    assert {kind: n for kind, n in verdict.counts.items() if n} == {"lost writes": 1}
    assert verdict.stats["acknowledged without an offset"] == 1


def test_an_acknowledged_value_found_at_another_offset_is_inconsistent() -> None:
    assert failing(history(sends=[acked("b", 2)])) == {"inconsistent offsets": 2}


def test_a_consumer_seeing_another_value_at_an_offset_is_inconsistent() -> None:
    assert failing(history(polls={"c": [(0, 0, "a"), (0, 1, "X")]})) == {"inconsistent offsets": 1}


def test_an_idempotent_value_written_twice_is_a_duplicate_and_a_plain_one_is_allowed() -> None:
    final = {0: [(0, "a"), (1, "a"), (2, "p"), (3, "p")]}
    h = History(sends=[acked("a", 0), acked("p", 2, idempotent=False)], final=final)
    verdict = check(h)
    assert failing(h) == {"duplicates": 1}
    assert verdict.stats["duplicates without idempotence"] == 1


def test_a_consumer_jumping_over_offsets_in_the_log_is_a_poll_skip() -> None:
    assert failing(history(polls={"c": [(0, 0, "a"), (0, 2, "c")]})) == {"poll skips": 1}


def test_a_consumer_going_back_or_repeating_is_a_non_monotonic_poll() -> None:
    h = history(polls={"c": [(0, 0, "a"), (0, 1, "b"), (0, 1, "b"), (0, 0, "a")]})
    assert failing(h) == {"non-monotonic polls": 2}


def test_a_fault_on_the_active_controller_is_paired_with_the_next_leader_seen_before_the_next_fault() -> None:
    h = History(
        faults=[
            (1.0, f"kill -9 broker 1 ({ACTIVE_CONTROLLER}, epoch 1) for 2.0 s"),
            (3.0, "restart broker 1"),
            (5.0, f"SIGSTOP broker 2 ({ACTIVE_CONTROLLER}, epoch 2) for 1.0 s"),
            (6.0, "SIGCONT broker 2"),
            (8.0, "kill -9 broker 3 for 1.0 s"),
            (9.0, "restart broker 3"),
            (11.0, f"isolate (reset) broker 3 ({ACTIVE_CONTROLLER}, epoch 4) from the quorum for 1.0 s"),
            (12.0, "rejoin broker 3"),
        ],
        quorum=[(0.5, 1, 1), (2.5, 2, 2), (7.0, 3, 3), (9.5, 3, 4)],
    )
    assert controller_failovers(h) == [
        f"t=1.0s kill -9 broker 1 ({ACTIVE_CONTROLLER}, epoch 1) for 2.0 s: leader 1, epoch 1 -> leader 2, epoch 2 "
        "seen 1.5 s later, during the fault",
        f"t=5.0s SIGSTOP broker 2 ({ACTIVE_CONTROLLER}, epoch 2) for 1.0 s: leader 2, epoch 2 -> leader 3, epoch 3 "
        "seen 2.0 s later, after its undoing",
        f"t=11.0s isolate (reset) broker 3 ({ACTIVE_CONTROLLER}, epoch 4) from the quorum for 1.0 s: leader 3, "
        "epoch 4 -> no new leader or epoch seen before the next fault",
    ]


@pytest.fixture
def echo_port() -> object:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: _echo(c), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(1024):
            conn.sendall(data)


def roundtrip(port: int, payload: bytes = b"ping", timeout_s: float = 1.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(payload)
        return sock.recv(1024)


def test_the_proxy_forwards_until_cut_and_again_after_heal(echo_port: int) -> None:
    proxy = FaultProxy(echo_port, "test")
    try:
        assert roundtrip(proxy.port) == b"ping"
        proxy.cut("reset")
        try:
            answer = roundtrip(proxy.port)
        except OSError:  # reset while sending
            answer = b""
        assert answer == b"", "a cut proxy must close the connection, not forward"
        proxy.heal()
        assert roundtrip(proxy.port) == b"ping"
    finally:
        proxy.close()


def test_a_blackholed_proxy_keeps_the_connection_but_forwards_nothing(echo_port: int) -> None:
    proxy = FaultProxy(echo_port, "test")
    try:
        proxy.cut("blackhole")
        with pytest.raises(TimeoutError):
            roundtrip(proxy.port, timeout_s=0.5)
        proxy.heal()
        assert roundtrip(proxy.port) == b"ping"
    finally:
        proxy.close()


@pytest.mark.cluster  # fault_run starts and stops its own ProxiedCluster
def test_a_real_cluster_under_a_nemesis_keeps_a_valid_history(tmp_path: Path) -> None:
    history, verdict = fault_run(tmp_path, seconds=FAULT_SECONDS, seed=SEED, say=print)
    print(verdict.summary())
    for kind, examples in verdict.examples.items():
        print(f"{kind}: {examples}")
    assert verdict.ok, verdict.summary()
    kinds = {what.split(" ")[0] for _, what in history.faults}
    assert {"kill", "SIGSTOP", "cut", "isolate"} <= kinds, history.faults
    on_the_leader = {what.split(" ")[0] for _, what in history.faults if ACTIVE_CONTROLLER in what}
    assert {"kill", "SIGSTOP", "isolate"} <= on_the_leader, history.faults
    failovers = controller_failovers(history)
    print("\n".join(failovers))
    assert sum("during the fault" in line for line in failovers) >= 2, failovers
    epochs = [epoch for _, _, epoch in history.quorum]
    assert epochs == sorted(epochs) and len(set(epochs)) >= 3, history.quorum
    assert verdict.stats["acknowledged"] > 1000
    assert verdict.stats["polled"] >= verdict.stats["final records"]
