"""DelayedOperationPurgatory: completion by key, by deadline, and exactly once."""

from __future__ import annotations

from tierlog.replication.purgatory import DelayedOperation, DelayedOperationPurgatory


class WaitForBytes(DelayedOperation):
    def __init__(self, deadline_ms: int, available: dict[str, int], needed: int) -> None:
        super().__init__(deadline_ms)
        self.available = available
        self.needed = needed
        self.completions = 0

    def try_complete(self) -> bool:
        if sum(self.available.values()) >= self.needed:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.completions += 1


def test_operation_satisfiable_at_once_completes_without_being_watched() -> None:
    purgatory: DelayedOperationPurgatory[WaitForBytes] = DelayedOperationPurgatory("Fetch")
    op = WaitForBytes(1000, {"a": 10}, needed=5)
    assert purgatory.try_complete_else_watch(op, ["a"]) is True
    assert op.completions == 1
    assert purgatory.watched() == 0


def test_append_to_a_watched_key_completes_the_waiting_operation() -> None:
    purgatory: DelayedOperationPurgatory[WaitForBytes] = DelayedOperationPurgatory("Fetch")
    available = {"a": 0, "b": 0}
    op = WaitForBytes(1000, available, needed=5)
    assert purgatory.try_complete_else_watch(op, ["a", "b"]) is False
    available["b"] = 3
    assert purgatory.check_and_complete("b") == 0
    available["a"] = 3
    assert purgatory.check_and_complete("a") == 1
    assert op.completions == 1
    # Completed operations are dropped from the other key's watch list too.
    assert purgatory.check_and_complete("b") == 0
    assert op.completions == 1


def test_deadline_expires_the_operation_exactly_once() -> None:
    purgatory: DelayedOperationPurgatory[WaitForBytes] = DelayedOperationPurgatory("Fetch")
    early = WaitForBytes(100, {"a": 0}, needed=1)
    late = WaitForBytes(500, {"a": 0}, needed=1)
    purgatory.try_complete_else_watch(late, ["a"])
    purgatory.try_complete_else_watch(early, ["a"])
    assert purgatory.next_deadline_ms() == 100
    assert purgatory.expire(99) == 0
    assert purgatory.expire(100) == 1
    assert (early.completions, late.completions) == (1, 0)
    assert purgatory.next_deadline_ms() == 500
    assert purgatory.expire(10_000) == 1
    assert purgatory.expire(20_000) == 0
    assert late.completions == 1
    assert purgatory.watched() == 0


def test_operation_completed_by_key_is_not_expired_later() -> None:
    purgatory: DelayedOperationPurgatory[WaitForBytes] = DelayedOperationPurgatory("Fetch")
    available = {"a": 0}
    op = WaitForBytes(100, available, needed=1)
    purgatory.try_complete_else_watch(op, ["a"])
    available["a"] = 1
    purgatory.check_and_complete("a")
    assert purgatory.expire(1000) == 0
    assert op.completions == 1
    assert purgatory.next_deadline_ms() is None
