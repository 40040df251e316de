"""Replication trace events: every change of LEO, HW, remote LEO, ISR, leader epoch and log start
(docs/replication.md#trace).

An event is one row of a table: attribute, phase, old value, new value, and why. Partitions
hand events to an injected sink; the shell keeps a backlog and streams it. Events are emitted only when a
value actually changes, so a quiet partition produces none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from tierlog.common import TopicPartition

LEADER_LEO = "Leader LEO"
LEADER_HW = "Leader HW"
FOLLOWER_LEO = "Follower LEO"
FOLLOWER_HW = "Follower HW"
ISR = "ISR"
LEADER_EPOCH = "Leader epoch"
LOG_START = "Log start"
REMOTE_END = "Remote end"

PRODUCE = "PRODUCE"
FETCH_RESPONSE = "FETCH response"
BECOME_LEADER = "become leader"
BECOME_FOLLOWER = "become follower"
TRUNCATE = "truncate"
ISR_SHRINK = "ISR shrink"
ISR_EXPAND = "ISR expand"
ALTER_PARTITION = "AlterPartition"
DELETE_RECORDS = "DeleteRecords"
BUILD_REMOTE_AUX_STATE = "BuildingRemoteLogAuxState"
REMOTE_COPY = "remote copy"
REMOTE_EXPIRE = "remote retention"


# Both are looked up on every follower fetch: formatted once per broker id.
@cache
def remote_leo(broker_id: int) -> str:
    """The leader's copy of a follower's LEO (docs/replication.md#terms)."""
    return f"Remote LEO (broker {broker_id})"


@cache
def fetch_from(broker_id: int) -> str:
    """The phase of a leader handling a FETCH from a follower."""
    return f"FETCH from broker {broker_id}"


@dataclass(frozen=True, slots=True)
class TraceEvent:
    topic_partition: TopicPartition
    broker_id: int
    attribute: str
    phase: str
    old: int | list[int]
    new: int | list[int]
    why: str
    time_ms: int


TraceSink = Callable[[TraceEvent], None]


def ignore_trace(event: TraceEvent) -> None:
    """The default sink: nobody is watching."""
