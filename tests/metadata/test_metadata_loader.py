"""The broker's MetadataLoader as a state machine: it follows the metadata log one fetch at a time and publishes
its image only once caught up with the log and past the broker's own registration."""

from __future__ import annotations

from tierlog.common import Idle
from tierlog.metadata.loader import METADATA_FETCH_WAIT_MS, RETRY_BACKOFF_MS, MetadataFetchRequest, MetadataLoader
from tierlog.metadata.records import MetadataRecord, ProducerIdsRecord

NOW = 1_700_000_000_000


def records(first: int, last: int) -> list[tuple[int, MetadataRecord]]:
    return [(offset, ProducerIdsRecord(1, 1000 * offset)) for offset in range(first, last + 1)]


def test_the_loader_fetches_from_the_offset_after_its_image() -> None:
    loader = MetadataLoader()
    assert loader.poll(NOW) == MetadataFetchRequest(0, METADATA_FETCH_WAIT_MS)
    loader.on_records(records(0, 2), 10)
    assert loader.poll(NOW) == MetadataFetchRequest(3, METADATA_FETCH_WAIT_MS)


def test_the_image_is_published_once_caught_up_with_the_log_and_past_the_registration() -> None:
    loader = MetadataLoader()
    assert not loader.allow_publishing_from(5)
    # Past the registration, but the log goes on to offset 7: a restarted broker's image may still show
    # leaderships the controller has moved away since.
    assert not loader.on_records(records(0, 5), 8)
    assert loader.on_records(records(6, 7), 8)


def test_an_image_caught_up_with_the_log_waits_for_the_registration() -> None:
    loader = MetadataLoader()
    assert not loader.on_records(records(0, 3), 4)
    assert not loader.allow_publishing_from(4)
    assert loader.on_records(records(4, 4), 5)
    assert loader.allow_publishing_from(2)


def test_an_answer_without_records_publishes_nothing_new() -> None:
    loader = MetadataLoader()
    loader.allow_publishing_from(0)
    assert loader.on_records(records(0, 1), 2)
    assert not loader.on_records([], 2)


def test_records_the_image_holds_already_are_not_applied_twice() -> None:
    loader = MetadataLoader()
    loader.on_records(records(0, 2), 3)
    loader.on_records(records(1, 3), 4)
    assert loader.image.offset == 3
    assert loader.image.next_producer_id == 3000


def test_a_failed_fetch_is_retried_after_a_pause() -> None:
    loader = MetadataLoader()
    loader.on_fetch_failed(NOW)
    assert loader.poll(NOW) == Idle(NOW + RETRY_BACKOFF_MS)
    assert loader.poll(NOW + RETRY_BACKOFF_MS) == MetadataFetchRequest(0, METADATA_FETCH_WAIT_MS)


def test_control_batches_after_the_last_record_move_the_fetch_on_and_count_towards_catching_up() -> None:
    """A quorum's log holds LeaderChangeMessage control batches, which carry no metadata record: an answer ending
    in one moves the next fetch past it, and the image is caught up once the fetch offset reaches the HW."""
    loader = MetadataLoader()
    loader.allow_publishing_from(1)
    assert not loader.on_records(records(1, 2), 4, end_offset=3)
    assert loader.poll(NOW) == MetadataFetchRequest(3, METADATA_FETCH_WAIT_MS)
    assert loader.on_records([], 4, end_offset=4)
    assert loader.poll(NOW) == MetadataFetchRequest(4, METADATA_FETCH_WAIT_MS)
    assert loader.image.offset == 2
