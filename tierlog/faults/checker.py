"""The history of a fault run and its checker (pure: no I/O, no clock).

A history holds what the clients were told: each send with its outcome (acknowledged at a partition and
offset, failed, or unknown), each consumer's records in the order it polled them, and a final read of every
partition after the faults healed. The checker reports, as Jepsen's Kafka workloads do:
- lost writes: acknowledged (acks=all) but absent from the final read;
- inconsistent offsets: one (partition, offset) seen holding different values (acknowledgement, any poll,
  the final read), or an acknowledged value found at another offset;
- duplicates: a value at two offsets (fails the run only for idempotent producers: without idempotence a
  retry may legitimately write twice);
- poll skips: a consumer's next offset on a partition jumps over offsets the final read holds;
- non-monotonic polls: a consumer's offsets on a partition going backwards or repeating.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

MAX_EXAMPLES = 5


@dataclass(slots=True)
class Send:
    value: str
    idempotent: bool
    # "ok" (partition set; offset -1 if the client was not told it), "failed" (the client gave up: it may or
    # may not be in the log), "unknown" (no answer yet).
    outcome: str = "unknown"
    partition: int = -1
    offset: int = -1


class Timeline(Protocol):
    """What the nemesis writes into a history, whichever workload it belongs to."""

    # (seconds since start, what) for every fault and heal
    faults: list[tuple[float, str]]
    # (seconds since start, leader, epoch) whenever DescribeQuorum showed a new leader or epoch
    quorum: list[tuple[float, int, int]]


@dataclass(slots=True)
class History:
    sends: list[Send] = field(default_factory=list)
    # consumer -> [(partition, offset, value)] in poll order
    polls: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    # partition -> [(offset, value)] from its log start to its end, after healing
    final: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    # (seconds since start, what) for every fault and heal
    faults: list[tuple[float, str]] = field(default_factory=list)
    # (seconds since start, leader, epoch) whenever DescribeQuorum showed a new leader or epoch of the controller
    # quorum (the first at the start)
    quorum: list[tuple[float, int, int]] = field(default_factory=list)


@dataclass(slots=True)
class Verdict:
    counts: dict[str, int]
    examples: dict[str, list[str]]
    stats: dict[str, int]

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def summary(self) -> str:
        anomalies = ", ".join(f"{name} {count}" for name, count in self.counts.items())
        stats = ", ".join(f"{name} {count}" for name, count in self.stats.items())
        return f"{'valid' if self.ok else 'INVALID'}: {anomalies}; {stats}"


def check(history: History) -> Verdict:
    counts: dict[str, int] = defaultdict(int)
    examples: dict[str, list[str]] = defaultdict(list)

    def anomaly(kind: str, example: str) -> None:
        counts[kind] += 1
        if len(examples[kind]) < MAX_EXAMPLES:
            examples[kind].append(example)

    at: dict[tuple[int, int], str] = {}
    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for partition, records in history.final.items():
        for offset, value in records:
            at[(partition, offset)] = value
            where[value].append((partition, offset))

    def observe(partition: int, offset: int, value: str, by: str) -> None:
        known = at.get((partition, offset))
        if known is not None and known != value:
            anomaly("inconsistent offsets", f"{partition}/{offset}: {by} saw {value!r}, the final read {known!r}")

    acknowledged = without_offset = 0
    for send in history.sends:
        if send.outcome != "ok":
            continue
        acknowledged += 1
        locations = where.get(send.value, [])
        if not locations:
            anomaly("lost writes", f"{send.value!r} acknowledged at {send.partition}/{send.offset}, not in the log")
        elif send.offset < 0:
            without_offset += 1  # confirmed without an offset: being in the log is all that can be checked
            continue
        elif (send.partition, send.offset) not in locations:
            anomaly(
                "inconsistent offsets",
                f"{send.value!r} acknowledged at {send.partition}/{send.offset}, found at {locations}",
            )
        observe(send.partition, send.offset, send.value, "the acknowledgement")
    idempotent = {send.value for send in history.sends if send.idempotent}
    for value, locations in where.items():
        if len(locations) > 1:
            kind = "duplicates" if value in idempotent else "duplicates (allowed without idempotence)"
            anomaly(kind, f"{value!r} at {locations}")
    polled = 0
    for consumer, records in history.polls.items():
        last: dict[int, int] = {}
        for partition, offset, value in records:
            polled += 1
            observe(partition, offset, value, consumer)
            previous = last.get(partition)
            if previous is not None:
                if offset <= previous:
                    anomaly("non-monotonic polls", f"{consumer} on {partition}: offset {offset} after {previous}")
                else:
                    skipped = [o for o in range(previous + 1, offset) if (partition, o) in at]
                    if skipped:
                        anomaly(
                            "poll skips", f"{consumer} on {partition}: {previous} -> {offset} skipped {skipped[:5]}"
                        )
            last[partition] = offset
    kinds = ("lost writes", "inconsistent offsets", "duplicates", "poll skips", "non-monotonic polls")
    failing = {kind: counts.get(kind, 0) for kind in kinds}
    allowed = counts.get("duplicates (allowed without idempotence)", 0)
    stats = {
        "sends": len(history.sends),
        "acknowledged": acknowledged,
        "acknowledged without an offset": without_offset,
        "failed": sum(1 for s in history.sends if s.outcome == "failed"),
        "unknown": sum(1 for s in history.sends if s.outcome == "unknown"),
        "polled": polled,
        "final records": len(at),
        "faults": len(history.faults),
        "duplicates without idempotence": allowed,
    }
    return Verdict(failing, dict(examples), stats)
