"""Kafka's MetadataLoader without I/O: a broker follows the controller's metadata log, folds every record into its
own `ClusterMetadata` image (the same `apply` the controller uses) and decides when the image may be published
to the broker's replicas.

The image is published only once the broker has caught up with the log, and at least to its own registration: a
restarted broker must never act on the leaderships it held before it died, which the controller has moved away by
then (the registration of a new incarnation fences the old one).

The world around it asks `poll(now_ms)` for the next fetch (long-polling: the controller answers when records come
or the wait ends), hands the answer to `on_records`, which says whether to publish now, or reports with
`on_fetch_failed` that none came. The asyncio shell (server/metadata_loader.py) does that over the controller
channel, the simulator over its network.
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
    """A Fetch of the metadata log from `offset`, answered at once if there are records there, else when some
    are committed or `max_wait_ms` has passed; the answer carries the log's end offset (its high watermark)."""

    offset: int
    max_wait_ms: int


class MetadataLoader:
    def __init__(
        self, *, fetch_wait_ms: int = METADATA_FETCH_WAIT_MS, retry_backoff_ms: int = RETRY_BACKOFF_MS
    ) -> None:
        self.image = ClusterMetadata()
        # The end of the metadata log as of the last answer.
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
        return MetadataFetchRequest(self.fetch_offset, self._fetch_wait_ms)

    def on_records(
        self, records: Sequence[tuple[int, MetadataRecord]], high_watermark: int, end_offset: int | None = None
    ) -> bool:
        """The answer to a fetch: (offset, record) pairs from the offset asked for, the log's end offset (its high
        watermark) and, when the answer's batches end past its last record (control batches), where they end.
        True if the image is to be published now."""
        for offset, record in records:
            # A record the image already holds (an answer to an older fetch) is not applied twice.
            if offset > self.image.offset:
                self.image.apply(offset, record)
        previous_fetch_offset = self.fetch_offset
        self.fetch_offset = max(self.fetch_offset, self.image.offset + 1, end_offset or 0)
        self.high_watermark = high_watermark
        return (bool(records) or self.fetch_offset > previous_fetch_offset) and self._may_publish()

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
