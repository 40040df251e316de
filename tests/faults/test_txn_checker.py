"""The transactional checker on hand-made histories: a valid one passes, and each anomaly it names is found
alone (docs/transactions.md#proof)."""

from __future__ import annotations

from tierlog.faults.txn_checker import (
    ABORTED,
    COMMITTED,
    UNKNOWN,
    OffsetFetch,
    Transaction,
    TxnHistory,
    check_transactions,
)

OUT = "out"


def txn(txn_id: str, outcome: str, *records: tuple[int, str], intent: str = "commit") -> Transaction:
    return Transaction(txn_id, intent, outcome, [(OUT, partition, value) for partition, value in records])


def ctp(txn_id: str, outcome: str, inputs: list[tuple[int, int]], offsets: dict[int, int]) -> Transaction:
    """A consume-transform-produce transaction: one output per input, written to partition input offset % 2."""
    t = Transaction(txn_id, "commit", outcome, offsets=dict(offsets))
    for partition, offset in inputs:
        value = f"{txn_id}|{partition}:{offset}"
        t.records.append((OUT, offset % 2, value))
        t.sources[value] = (partition, offset)
    return t


def valid() -> TxnHistory:
    """p-1 commits a1/a2 over two partitions, p-2 aborts b1/b2 on purpose (in the log, skipped by read_committed),
    p-3's outcome is unknown and it did commit; consumers polled what committed in order."""
    return TxnHistory(
        transactions=[
            txn("p-1/0", COMMITTED, (0, "a1"), (1, "a2")),
            txn("p-2/0", ABORTED, (0, "b1"), (1, "b2"), intent="abort"),
            txn("p-3/0", UNKNOWN, (0, "c1"), (1, "c2")),
        ],
        polls={"r-1": [(OUT, 0, 0, "a1"), (OUT, 0, 3, "c1"), (OUT, 1, 0, "a2")], "r-2": [(OUT, 1, 3, "c2")]},
        # offsets 1 and 2 are b1 and p-2's abort marker; 4 and 5 the markers of the others
        committed_final={(OUT, 0): [(0, "a1"), (3, "c1")], (OUT, 1): [(0, "a2"), (3, "c2")]},
        uncommitted_final={(OUT, 0): [(0, "a1"), (1, "b1"), (3, "c1")], (OUT, 1): [(0, "a2"), (1, "b2"), (3, "c2")]},
    )


def with_ctp(*transactions: Transaction, group_offsets: dict[int, int], polls: object = None) -> TxnHistory:
    """Input partition 0 holds i0, i1, i2 at offsets 0-2; the outputs the committed transactions wrote."""
    h = TxnHistory(transactions=list(transactions), inputs_final={0: [(0, "i0"), (1, "i1"), (2, "i2")]})
    h.group_offsets = group_offsets
    offsets = {0: 0, 1: 0}
    for t in transactions:
        if t.outcome != COMMITTED:
            continue
        for _, partition, value in t.records:
            h.committed_final.setdefault((OUT, partition), []).append((offsets[partition], value))
            offsets[partition] += 1
    return h


def failing(h: TxnHistory) -> dict[str, int]:
    return {kind: count for kind, count in check_transactions(h).counts.items() if count}


def test_a_valid_history_has_no_anomaly() -> None:
    verdict = check_transactions(valid())
    assert verdict.ok, verdict.summary()
    assert verdict.stats["committed"] == 1 and verdict.stats["aborted on purpose"] == 1
    assert verdict.stats["unknown"] == 1 and verdict.stats["visible"] == 2
    assert verdict.stats["aborted records in the log"] == 2 and verdict.stats["polled"] == 4


def test_a_transaction_of_unknown_outcome_may_be_wholly_absent() -> None:
    h = valid()
    h.committed_final = {(OUT, 0): [(0, "a1")], (OUT, 1): [(0, "a2")]}
    h.polls = {}
    assert check_transactions(h).ok


def test_an_aborted_record_in_the_read_committed_log_is_an_aborted_read() -> None:
    h = valid()
    h.committed_final[(OUT, 0)].insert(1, (1, "b1"))
    h.committed_final[(OUT, 1)].insert(1, (1, "b2"))
    assert failing(h) == {"aborted reads": 2}


def test_a_consumer_polling_an_aborted_record_is_an_aborted_read() -> None:
    h = valid()
    h.polls["r-2"].insert(0, (OUT, 1, 1, "b2"))
    assert failing(h) == {"aborted reads": 1}


def test_a_consumer_polling_what_did_not_commit_in_the_end_is_a_dirty_read() -> None:
    h = valid()
    h.committed_final = {(OUT, 0): [(0, "a1")], (OUT, 1): [(0, "a2")]}  # p-3 did not commit after all
    h.polls = {"r-1": [(OUT, 0, 0, "a1"), (OUT, 0, 3, "c1")]}
    assert failing(h) == {"dirty reads": 1}


def test_a_committed_record_missing_from_the_log_is_a_lost_commit_and_tears_its_transaction() -> None:
    h = valid()
    h.committed_final[(OUT, 1)] = [(3, "c2")]
    h.polls = {}
    assert failing(h) == {"lost commits": 1, "torn transactions": 1}


def test_a_committed_transaction_wholly_missing_is_lost_but_not_torn() -> None:
    h = valid()
    h.committed_final = {(OUT, 0): [(3, "c1")], (OUT, 1): [(3, "c2")]}
    h.polls = {}
    assert failing(h) == {"lost commits": 2}


def test_a_transaction_of_unknown_outcome_visible_in_part_is_torn() -> None:
    h = valid()
    h.committed_final[(OUT, 1)] = [(0, "a2")]
    h.polls = {}
    assert failing(h) == {"torn transactions": 1}


def test_a_record_at_two_offsets_is_a_duplicate() -> None:
    h = valid()
    h.committed_final[(OUT, 0)].append((6, "a1"))
    assert failing(h) == {"duplicates": 1}


def test_a_consumer_seeing_another_value_at_an_offset_is_inconsistent() -> None:
    h = valid()
    h.polls["r-2"] = [(OUT, 1, 0, "c2")]
    assert failing(h) == {"inconsistent offsets": 1}


def test_a_consumer_jumping_over_a_committed_offset_is_a_poll_skip() -> None:
    h = valid()
    h.polls["r-1"] = [(OUT, 0, 0, "a1"), (OUT, 0, 6, "z")]
    h.committed_final[(OUT, 0)].append((6, "z"))
    assert failing(h) == {"poll skips": 1}


def test_jumping_over_aborted_records_and_markers_is_no_skip() -> None:
    h = valid()
    h.polls = {"r-1": [(OUT, 0, 0, "a1"), (OUT, 0, 3, "c1")]}  # over b1 (1) and p-2's marker (2)
    assert check_transactions(h).ok


def test_a_consumer_going_back_is_a_non_monotonic_poll() -> None:
    h = valid()
    h.polls["r-1"] = [(OUT, 0, 3, "c1"), (OUT, 0, 0, "a1")]
    assert failing(h) == {"non-monotonic polls": 1}


def test_outputs_matching_the_committed_offsets_exactly_once_are_valid() -> None:
    h = with_ctp(
        ctp("c-1/0", COMMITTED, [(0, 0), (0, 1)], {0: 2}),
        ctp("c-1/1", ABORTED, [(0, 2)], {0: 3}),
        ctp("c-1/2", COMMITTED, [(0, 2)], {0: 3}),
        group_offsets={0: 3},
    )
    verdict = check_transactions(h)
    assert verdict.ok, verdict.summary()
    assert verdict.stats["inputs processed exactly once"] == 3


def test_an_input_below_the_committed_offset_without_output_is_found() -> None:
    h = with_ctp(ctp("c-1/0", COMMITTED, [(0, 0)], {0: 1}), group_offsets={0: 2})
    assert failing(h) == {"input without output": 1}


def test_an_output_whose_offsets_did_not_move_with_it_is_found() -> None:
    h = with_ctp(ctp("c-1/0", COMMITTED, [(0, 0), (0, 1)], {0: 2}), group_offsets={0: 1})
    assert failing(h) == {"output without its offset": 1}


def test_an_input_with_two_committed_outputs_is_not_exactly_once() -> None:
    h = with_ctp(
        ctp("c-1/0", COMMITTED, [(0, 0)], {0: 1}),
        ctp("c-2/0", COMMITTED, [(0, 0)], {0: 1}),  # a zombie's transaction that was not fenced
        group_offsets={0: 1},
    )
    assert failing(h) == {"duplicate output": 1}


def test_an_output_of_an_input_the_topic_does_not_hold_is_found() -> None:
    h = with_ctp(ctp("c-1/0", COMMITTED, [(0, 0), (0, 1), (0, 2), (0, 7)], {0: 8}), group_offsets={0: 8})
    assert failing(h) == {"output of no input": 1}


def test_a_rewind_told_an_offset_below_a_committed_transaction_s_is_a_stale_offset_fetch() -> None:
    h = with_ctp(
        ctp("c-1/0", COMMITTED, [(0, 0), (0, 1)], {0: 2}),
        ctp("c-1/1", ABORTED, [(0, 2)], {0: 3}),
        ctp("c-1/2", COMMITTED, [(0, 2)], {0: 3}),
        group_offsets={0: 3},
    )
    # After c-1/1's abort: told 2 is right; told 1 when c-1/0 had committed 2 is stale; c-1/2 had not ended yet.
    h.offset_fetches = [OffsetFetch("c-1", 2, {0: 2}), OffsetFetch("c-1", 2, {0: 1})]
    assert failing(h) == {"stale offset fetches": 1}


def test_a_wait_after_healing_that_timed_out_is_a_stall() -> None:
    h = valid()
    h.stalls = ["timed out after 90.0s waiting for the processors to commit every input"]
    assert failing(h) == {"stalls": 1}
