"""The history of a transactional fault run and its checker (pure: no I/O, no clock).

A transactional history holds what the clients were told: every transaction a producer began (the records it
sent, to which topic and partition, whether it meant to commit or abort, and the outcome the client reported:
committed, aborted, or unknown when the client gave up or was fenced mid-commit), the input positions a
consume-transform-produce transaction sent with its offsets (send_offsets_to_transaction), what each
read_committed consumer polled in order, and after the faults healed: a read_committed and a read_uncommitted
read of every partition the transactions wrote, a read of the input topic and the group's committed offsets.

The checker reports (docs/transactions.md#proof):
- aborted reads: a record of a transaction the client saw aborted, in the read_committed log or in a
  read_committed poll;
- dirty reads: a record a read_committed consumer polled that the read_committed log does not hold in the end
  (a transaction it saw that did not commit);
- lost commits: a record of a transaction the client saw committed, absent from the read_committed log;
- torn transactions: a transaction with some of its records in the read_committed log and others not (each
  transaction is atomically visible across partitions, whatever its outcome);
- duplicates: a record at two offsets of the read_committed log (every transactional producer is idempotent);
- inconsistent offsets: a poll seeing another value at an offset than the read_committed log;
- poll skips, non-monotonic polls: a consumer jumping over an offset the read_committed log holds, or going back;
- stalls: after healing, the processors did not catch up with the inputs, or a last stable offset did not reach
  its high watermark (a transaction left hanging), in time;
- stale offset fetches: a processor rewinding after an abort read the group's committed offsets (OffsetFetch with
  require_stable, KIP-447) and got an offset below one a transaction had committed before it asked;
- offsets apart from their output (consume-transform-produce, exactly once): with the group's committed offset
  C on an input partition, every input below C has exactly one output in the read_committed log and no input
  at or past C has one ("input without output", "output without its offset", "duplicate output"), and every
  output names an input the input topic holds at that offset ("output of no input").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from tierlog.faults.checker import MAX_EXAMPLES, Verdict

COMMITTED = "committed"
ABORTED = "aborted"
UNKNOWN = "unknown"

# (topic, partition)
Partition = tuple[str, int]

ANOMALIES = (
    "aborted reads",
    "dirty reads",
    "lost commits",
    "torn transactions",
    "duplicates",
    "inconsistent offsets",
    "poll skips",
    "non-monotonic polls",
    "input without output",
    "output without its offset",
    "duplicate output",
    "output of no input",
    "stale offset fetches",
    "stalls",
)


@dataclass(slots=True)
class Transaction:
    """One transaction a producer began. Every record value is unique across the run."""

    txn_id: str
    # "commit" or "abort": what the producer meant to do with it.
    intent: str
    # COMMITTED (commit_transaction returned), ABORTED (abort_transaction returned), UNKNOWN (neither: the
    # client gave up, or was fenced or lost its producer while ending it).
    outcome: str = UNKNOWN
    # (topic, partition, value) of every record the producer handed to the client in the transaction
    records: list[tuple[str, int, str]] = field(default_factory=list)
    # consume-transform-produce: output value -> (input partition, input offset) it was made from
    sources: dict[str, tuple[int, int]] = field(default_factory=dict)
    # consume-transform-produce: input partition -> next offset, as sent with send_offsets_to_transaction
    offsets: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class OffsetFetch:
    """A processor read the group's committed offsets (to rewind after an abort)."""

    consumer: str
    # how many transactions had ended (TxnHistory.transactions) when it asked
    after: int
    # input partition -> the committed offset it was told
    offsets: dict[int, int]


@dataclass(slots=True)
class TxnHistory:
    transactions: list[Transaction] = field(default_factory=list)
    # read_committed consumer -> [(topic, partition, offset, value)] in poll order
    polls: dict[str, list[tuple[str, int, int, str]]] = field(default_factory=dict)
    # After healing, every partition the transactions wrote -> [(offset, value)], read_committed and
    # read_uncommitted (control batches are never returned to a client).
    committed_final: dict[Partition, list[tuple[int, str]]] = field(default_factory=dict)
    uncommitted_final: dict[Partition, list[tuple[int, str]]] = field(default_factory=dict)
    # consume-transform-produce: the input topic after healing, partition -> [(offset, value)], and the group's
    # committed offsets (partition -> next offset to read; a partition without one has none committed)
    inputs_final: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    group_offsets: dict[int, int] = field(default_factory=dict)
    offset_fetches: list[OffsetFetch] = field(default_factory=list)
    # what the run waited for after healing and did not see in time (the processors catching up, the last
    # stable offsets reaching the high watermarks): a liveness failure; the history is checked all the same
    stalls: list[str] = field(default_factory=list)
    # as History's: (seconds since start, what) for every fault and heal, (seconds, leader, epoch) of the quorum
    faults: list[tuple[float, str]] = field(default_factory=list)
    quorum: list[tuple[float, int, int]] = field(default_factory=list)


def check_transactions(history: TxnHistory) -> Verdict:
    counts: dict[str, int] = defaultdict(int)
    examples: dict[str, list[str]] = defaultdict(list)

    def anomaly(kind: str, example: str) -> None:
        counts[kind] += 1
        if len(examples[kind]) < MAX_EXAMPLES:
            examples[kind].append(example)

    owner: dict[str, Transaction] = {}
    for txn in history.transactions:
        for _, _, value in txn.records:
            owner[value] = txn
    at: dict[tuple[str, int, int], str] = {}
    where: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for (topic, partition), records in history.committed_final.items():
        for offset, value in records:
            at[(topic, partition, offset)] = value
            where[value].append((topic, partition, offset))

    for value, locations in where.items():
        txn = owner.get(value)
        if _aborted(txn):
            anomaly("aborted reads", f"{value!r} of aborted {txn.txn_id} in the read_committed log at {locations}")
        if len(locations) > 1:
            anomaly("duplicates", f"{value!r} at {locations}")

    visible_txns = 0
    for txn in history.transactions:
        present = [value for _, _, value in txn.records if value in where]
        if txn.outcome == COMMITTED:
            for topic, partition, value in txn.records:
                if value not in where:
                    anomaly("lost commits", f"{value!r} of committed {txn.txn_id} (sent to {topic}/{partition})")
        if present and len(present) < len(txn.records):
            missing = [value for _, _, value in txn.records if value not in where]
            anomaly(
                "torn transactions",
                f"{txn.txn_id} ({txn.outcome}): {len(present)} of {len(txn.records)} records visible, "
                f"missing {missing[:3]}",
            )
        visible_txns += bool(present)

    polled = 0
    for consumer, records in history.polls.items():
        last: dict[Partition, int] = {}
        for topic, partition, offset, value in records:
            polled += 1
            txn = owner.get(value)
            if _aborted(txn):
                anomaly("aborted reads", f"{consumer} polled {value!r} of aborted {txn.txn_id} at {partition}/{offset}")
            elif value not in where:
                anomaly("dirty reads", f"{consumer} polled {value!r} at {topic}/{partition}/{offset}, not committed")
            known = at.get((topic, partition, offset))
            if known is not None and known != value:
                anomaly(
                    "inconsistent offsets",
                    f"{topic}/{partition}/{offset}: {consumer} saw {value!r}, the read_committed log {known!r}",
                )
            previous = last.get((topic, partition))
            if previous is not None:
                if offset <= previous:
                    anomaly(
                        "non-monotonic polls", f"{consumer} on {topic}/{partition}: offset {offset} after {previous}"
                    )
                else:
                    # (an aborted record there is an aborted read already: not reading it is right)
                    skipped = [
                        o
                        for o in range(previous + 1, offset)
                        if (topic, partition, o) in at and not _aborted(owner.get(at[(topic, partition, o)]))
                    ]
                    if skipped:
                        anomaly(
                            "poll skips",
                            f"{consumer} on {topic}/{partition}: {previous} -> {offset} skipped {skipped[:5]}",
                        )
            last[(topic, partition)] = offset

    for stall in history.stalls:
        anomaly("stalls", stall)
    processed = _check_exactly_once(history, owner, where, anomaly)
    for fetch in history.offset_fetches:
        for txn in history.transactions[: fetch.after]:
            if txn.outcome != COMMITTED:
                continue
            for partition, offset in txn.offsets.items():
                told = fetch.offsets.get(partition)
                if told is not None and told < offset:
                    anomaly(
                        "stale offset fetches",
                        f"{fetch.consumer} was told {told} for input {partition} after {txn.txn_id} committed {offset}",
                    )
    aborted_in_log = sum(
        1 for records in history.uncommitted_final.values() for _, value in records if _aborted(owner.get(value))
    )
    stats = {
        "transactions": len(history.transactions),
        "committed": sum(1 for t in history.transactions if t.outcome == COMMITTED),
        "aborted": sum(1 for t in history.transactions if t.outcome == ABORTED),
        "aborted on purpose": sum(1 for t in history.transactions if t.outcome == ABORTED and t.intent == "abort"),
        "unknown": sum(1 for t in history.transactions if t.outcome == UNKNOWN),
        "visible": visible_txns,
        "committed records": len(at),
        # aborted records that reached the log: what read_committed readers had to skip
        "aborted records in the log": aborted_in_log,
        "polled": polled,
        "inputs processed exactly once": processed,
        "faults": len(history.faults),
    }
    return Verdict({kind: counts.get(kind, 0) for kind in ANOMALIES}, dict(examples), stats)


def _aborted(txn: Transaction | None) -> bool:
    return txn is not None and txn.outcome == ABORTED


def _check_exactly_once(
    history: TxnHistory,
    owner: dict[str, Transaction],
    where: dict[str, list[tuple[str, int, int]]],
    anomaly: Callable[[str, str], None],
) -> int:
    """The consume-transform-produce half: the group's committed offsets and the committed outputs agree.
    Returns how many inputs were processed exactly once (below their partition's committed offset)."""
    inputs = {
        (partition, offset): value for partition, records in history.inputs_final.items() for offset, value in records
    }
    outputs: dict[tuple[int, int], list[str]] = defaultdict(list)
    for value in where:
        txn = owner.get(value)
        if txn is not None and value in txn.sources:
            outputs[txn.sources[value]].append(value)
    for (partition, offset), values in sorted(outputs.items()):
        if (partition, offset) not in inputs:
            anomaly("output of no input", f"{values[:3]} made from input {partition}/{offset}, not in the input topic")
        if offset >= history.group_offsets.get(partition, 0):
            anomaly(
                "output without its offset",
                f"input {partition}/{offset} has output {values[:3]}, the group's offset is "
                f"{history.group_offsets.get(partition)}",
            )
        elif len(values) > 1:
            anomaly("duplicate output", f"input {partition}/{offset} has {len(values)} outputs: {values[:3]}")
    processed = 0
    for partition, committed in sorted(history.group_offsets.items()):
        for offset in range(committed):
            if (partition, offset) not in inputs:
                continue  # a transactional input topic's markers take offsets too
            if (partition, offset) in outputs:
                processed += 1
            else:
                anomaly(
                    "input without output",
                    f"input {partition}/{offset} is below the group's offset {committed} and has no output",
                )
    return processed
