"""The `quorum-state` file: a voter's election state, written and fsynced before the voter acts on it.

A voter that granted its vote in an epoch must never grant another in the same epoch, even across a crash or a
power loss, so the vote is durable before the VoteResponse leaves; likewise the epoch a node has seen. The file
is Kafka's (FileQuorumStateStore, data_version 0), so a Kafka operator finds what they expect:

    {"clusterId":"","leaderId":1,"leaderEpoch":5,"votedId":-1,"appliedOffset":0,
     "currentVoters":[{"voterId":1},{"voterId":2},{"voterId":3}],"data_version":0}

docs/quorum.md#quorum-state.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

QUORUM_STATE_FILE = "quorum-state"
NO_ID = -1


@dataclass(frozen=True, slots=True)
class ElectionState:
    epoch: int
    leader_id: int | None = None
    voted_id: int | None = None


class QuorumStateStore(Protocol):
    def read(self) -> ElectionState | None:
        """The state last written, or None when there is none (a new voter, or one that lost its disk)."""
        ...

    def write(self, state: ElectionState) -> None:
        """Durably replace the state: on return it survives a crash or a power loss."""
        ...


class FileQuorumStateStore:
    def __init__(self, path: Path, voters: frozenset[int]) -> None:
        self.path = path
        self._voters = voters

    def read(self) -> ElectionState | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ValueError(f"{self.path} is not a quorum-state file: {e}") from e
        if data.get("data_version") != 0:
            raise ValueError(f"{self.path} has data_version {data.get('data_version')!r}; tierlog reads version 0")
        leader_id = int(data.get("leaderId", NO_ID))
        voted_id = int(data.get("votedId", NO_ID))
        return ElectionState(
            epoch=int(data["leaderEpoch"]),
            leader_id=None if leader_id == NO_ID else leader_id,
            voted_id=None if voted_id == NO_ID else voted_id,
        )

    def write(self, state: ElectionState) -> None:
        data = {
            "clusterId": "",
            "leaderId": NO_ID if state.leader_id is None else state.leader_id,
            "leaderEpoch": state.epoch,
            "votedId": NO_ID if state.voted_id is None else state.voted_id,
            "appliedOffset": 0,
            "currentVoters": [{"voterId": voter} for voter in sorted(self._voters)],
            "data_version": 0,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w") as f:
            f.write(json.dumps(data, separators=(",", ":")))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
