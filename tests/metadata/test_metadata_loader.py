"""The broker's MetadataLoader as a state machine: it follows the metadata log one fetch at a time, from the end
of the last batch it got (past control batches) with that batch's epoch, and publishes its image only once
caught up with the log and past the broker's own registration."""

from __future__ import annotations

from tierlog.common import Idle
from tierlog.metadata.loader import (
    METADATA_FETCH_WAIT_MS,
    RETRY_BACKOFF_MS,
    MetadataBatches,
    MetadataFetchRequest,
    MetadataLoader,
)
from tierlog.metadata.records import ProducerIdsRecord

NOW = 1_700_000_000_000


def batches(first: int, last: int, epoch: int = 1) -> MetadataBatches:
    """Records `first`..`last`, the whole answer."""
    return MetadataBatches(
        [(offset, ProducerIdsRecord(1, 1000 * offset)) for offset in range(first, last + 1)], last + 1, epoch
    )


def test_the_loader_fetches_from_the_end_of_the_last_batch_with_its_epoch() -> None:
    loader = MetadataLoader()
    assert loader.poll(NOW) == MetadataFetchRequest(0, 0, METADATA_FETCH_WAIT_MS)
    loader.on_records(batches(0, 2, epoch=3), 10)
    assert loader.poll(NOW) == MetadataFetchRequest(3, 3, METADATA_FETCH_WAIT_MS)


def test_a_control_batch_at_the_end_moves_the_fetch_past_it_and_counts_for_catching_up() -> None:
    loader = MetadataLoader()
    loader.allow_publishing_from(1)
    # Records 0-1, then a new leader's LeaderChangeMessage at offset 2, the last committed batch.
    assert loader.on_records(MetadataBatches(batches(0, 1).records, 3, 2), 3)
    assert loader.image.offset == 1
    assert loader.poll(NOW) == MetadataFetchRequest(3, 2, METADATA_FETCH_WAIT_MS)
    assert not loader.on_records(MetadataBatches([], 3, -1), 3), "an empty answer changes nothing"
    assert loader.poll(NOW) == MetadataFetchRequest(3, 2, METADATA_FETCH_WAIT_MS)


def test_the_image_is_published_once_caught_up_with_the_log_and_past_the_registration() -> None:
    loader = MetadataLoader()
    assert not loader.allow_publishing_from(5)
    # Past the registration, but the log goes on to offset 7: a restarted broker's image may still show
    # leaderships the controller has moved away since.
    assert not loader.on_records(batches(0, 5), 8)
    assert loader.on_records(batches(6, 7), 8)


def test_an_image_caught_up_with_the_log_waits_for_the_registration() -> None:
    loader = MetadataLoader()
    assert not loader.on_records(batches(0, 3), 4)
    assert not loader.allow_publishing_from(4)
    assert loader.on_records(batches(4, 4), 5)
    assert loader.allow_publishing_from(2)


def test_an_answer_without_records_publishes_nothing_new() -> None:
    loader = MetadataLoader()
    loader.allow_publishing_from(0)
    assert loader.on_records(batches(0, 1), 2)
    assert not loader.on_records(MetadataBatches([], 2, -1), 2)


def test_records_the_image_holds_already_are_not_applied_twice_nor_move_the_fetch_back() -> None:
    loader = MetadataLoader()
    loader.on_records(batches(0, 2), 3)
    loader.on_records(batches(1, 3), 4)
    loader.on_records(batches(0, 1), 4)
    assert loader.image.offset == 3
    assert loader.image.next_producer_id == 3000
    assert loader.poll(NOW) == MetadataFetchRequest(4, 1, METADATA_FETCH_WAIT_MS)


def test_a_failed_fetch_is_retried_after_a_pause() -> None:
    loader = MetadataLoader()
    loader.on_fetch_failed(NOW)
    assert loader.poll(NOW) == Idle(NOW + RETRY_BACKOFF_MS)
    assert loader.poll(NOW + RETRY_BACKOFF_MS) == MetadataFetchRequest(0, 0, METADATA_FETCH_WAIT_MS)


def test_a_snapshot_replaces_the_image_and_the_next_fetch_starts_at_its_end() -> None:
    """A new broker whose fetch offset is gone from the controller's log loads the latest snapshot, then the
    records after it."""
    loader = MetadataLoader()
    loader.allow_publishing_from(40)
    assert loader.on_snapshot([ProducerIdsRecord(-1, 7000)], 50, 50)
    assert loader.image.offset == 49 and loader.image.next_producer_id == 7000
    assert loader.poll(NOW) == MetadataFetchRequest(50, -1, METADATA_FETCH_WAIT_MS)
    assert loader.on_records(batches(50, 51), 52)
    assert loader.image.next_producer_id == 51000


def test_a_snapshot_behind_the_log_end_is_not_published_until_caught_up() -> None:
    loader = MetadataLoader()
    loader.allow_publishing_from(0)
    assert not loader.on_snapshot([ProducerIdsRecord(-1, 7000)], 50, 60)
    assert loader.on_records(batches(50, 59), 60)
