"""Kafka's MetadataLoader without I/O: a broker follows the controller's metadata log, folds every record into its
own `ClusterMetadata` image (the same `apply` the controller uses) and decides when the image may be published
to the broker's replicas.

The image is published only once the broker has caught up with the log, and at least to its own registration: a
restarted broker must never act on the leaderships it held before it died, which the controller has moved away by
then (the registration of a new incarnation fences the old one).

The world around it asks `poll(now_ms)` for the next fetch (long-polling: the controller answers when records are
committed or the wait ends), hands the answer to `on_records`, which says whether to publish now, or reports with
`on_fetch_failed` that none came. The asyncio shell (server/metadata_loader.py) does that over the controller
channel, the simulator over its network. The broker is an observer of the quorum's log (docs/quorum.md#observers):
it gets committed batches only, so its image never has to be taken back, and it fetches from the end of the
last batch it got with that batch's epoch (a Raft Fetch's LastFetchedEpoch), past control batches, which hold
no metadata record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tierlog.common import Idle
from tierlog.metadata.image import ClusterMetadata
from tierlog.metadata.records import MetadataRecord

METADATA_FETCH_WAIT_MS = 500
RETRY_BACKOFF_MS = 200


@dataclass(frozen=True, slots=True)
class MetadataFetchRequest:
    """A Fetch of the metadata log from `offset`, answered at once if there are committed records there, else
    when some are committed or `max_wait_ms` has passed; the answer carries the log's high watermark.
    `last_fetched_epoch` is the epoch of the batch before `offset` (0 at the start of the log)."""

    offset: int
    last_fetched_epoch: int
    max_wait_ms: int


@dataclass(frozen=True, slots=True)
class MetadataBatches:
    """The metadata records of some whole batches of the log, the offset after the last of them (where the next
    fetch starts) and that batch's epoch; control batches count for both but hold no record."""

    records: Sequence[tuple[int, MetadataRecord]]
    next_offset: int
    last_epoch: int


class MetadataLoader:
    def __init__(
        self, *, fetch_wait_ms: int = METADATA_FETCH_WAIT_MS, retry_backoff_ms: int = RETRY_BACKOFF_MS
    ) -> None:
        self.image = ClusterMetadata()
        # Where the next fetch starts: after the last batch fetched, and that batch's epoch.
        self.fetch_offset = 0
        self.last_fetched_epoch = 0
        # The end of the committed metadata log as of the last answer.
        self.high_watermark = 0
        # Where the next fetch starts: past the last batch received, which may be a Raft control batch (a
        # LeaderChangeMessage) holding no metadata record, so the image's offset may lag behind it.
        self.fetch_offset = 0
        self._fetch_wait_ms = fetch_wait_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._retry_at_ms = 0
        # Offset the image must reach before it is published (the broker's registration record); None until the
        # broker has registered.
        self._publish_from_offset: int | None = None

    def poll(self, now_ms: int) -> MetadataFetchRequest | Idle:
        """The next fetch, or how long to wait first after a failed one. One fetch at a time."""
        if now_ms < self._retry_at_ms:
            return Idle(self._retry_at_ms)
        return MetadataFetchRequest(self.fetch_offset, self.last_fetched_epoch, self._fetch_wait_ms)

    def on_records(self, batches: MetadataBatches, high_watermark: int) -> bool:
        """The answer to a fetch: the batches from the offset asked for, and the log's high watermark. True if
        the image is to be published now."""
        for offset, record in batches.records:
            # A record the image already holds (an answer to an older fetch) is not applied twice.
            if offset > self.image.offset:
                self.image.apply(offset, record)
        advanced = batches.next_offset > self.fetch_offset
        if advanced:
            self.fetch_offset = batches.next_offset
            self.last_fetched_epoch = batches.last_epoch
        self.high_watermark = high_watermark
        return advanced and self._may_publish()

    def on_snapshot(self, records: Sequence[MetadataRecord], end_offset: int, high_watermark: int) -> bool:
        """The answer to a fetch whose offset is gone from the controller's log: the records of its latest snapshot,
        which end at `end_offset`. The image becomes the snapshot's, and the next fetch starts at its end (Kafka's
        MetadataLoader loads a snapshot the same way). True if the image is to be published now.
        docs/quorum.md#snapshots."""
        self.image = ClusterMetadata.from_snapshot(records, end_offset)
        self.fetch_offset = end_offset
        # No epoch: the leader judges a fetch from a snapshot's end by its offset alone.
        self.last_fetched_epoch = -1
        self.high_watermark = high_watermark
        return self._may_publish()

    def on_fetch_failed(self, now_ms: int) -> None:
        """No answer came (the controller is unreachable or did not answer in time): fetch again after a pause."""
        self._retry_at_ms = now_ms + self._retry_backoff_ms

    def allow_publishing_from(self, offset: int) -> bool:
        """The broker registered with the record at `offset`: the image may be published once it holds that
        record. True if the image is to be published now."""
        self._publish_from_offset = offset
        return self._may_publish()

    def _may_publish(self) -> bool:
        caught_up = self.fetch_offset >= self.high_watermark
        registered = self._publish_from_offset is not None and self.image.offset >= self._publish_from_offset
        return caught_up and registered
