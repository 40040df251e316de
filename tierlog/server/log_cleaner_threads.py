"""The log cleaner's shell: Kafka's CleanerThreads as asyncio tasks, the heavy part on worker threads.

Each of `log.cleaner.threads` loops picks the dirtiest compacted log on the event loop, runs the clean (read
closed segments, filter, write `.cleaned` files) with asyncio.to_thread, and swaps the result in back on the
event loop, where nothing else can change the log meanwhile; a log that changed while it was cleaned
(retention, truncation, deletion) keeps its segments and the cleaned files are removed. With no work a loop
waits log.cleaner.backoff.ms. Stopping lets a running clean give up at its next batch instead of abandoning
its thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import CollectorRegistry

from tierlog.config import KafkaConfig
from tierlog.config_def import ConfigException
from tierlog.server.clock import now_ms
from tierlog.server.metrics import ScrapeCollector, ScrapedMetric
from tierlog.storage.log_cleaner import CleanerConfig, CleaningTask, LogCleaner, LogCleaningAbortedError
from tierlog.storage.log_manager import LogManager

logger = logging.getLogger(__name__)


def cleaner_config(config: KafkaConfig) -> CleanerConfig:
    """Kafka's CleanerConfig from the broker's log.cleaner.* settings."""
    return CleanerConfig(
        num_threads=config.get_int("log.cleaner.threads"),
        dedupe_buffer_size=config.get_int("log.cleaner.dedupe.buffer.size"),
        dedupe_buffer_load_factor=config.get_double("log.cleaner.io.buffer.load.factor"),
        io_buffer_size=config.get_int("log.cleaner.io.buffer.size"),
        backoff_ms=config.get_int("log.cleaner.backoff.ms"),
        enable_cleaner=config.get_bool("log.cleaner.enable"),
    )


class LogCleanerThreads:
    def __init__(self, config: KafkaConfig, log_manager: LogManager, registry: CollectorRegistry) -> None:
        self.config = cleaner_config(config)
        try:
            self.cleaner = LogCleaner(self.config, log_manager)
        except ValueError as e:
            raise ConfigException(str(e)) from None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        # Read by the worker threads between batches: a plain attribute is enough for a one-way flag.
        self._stopping = False
        self._register_metrics(registry)

    async def reconfigure(self, config: CleanerConfig) -> None:
        """New log.cleaner.* settings (dynamic broker configs), as Kafka's LogCleaner.reconfigure: the threads
        stop (a clean in progress is given up and redone later), then start again with them."""
        await self.stop()
        self.config = self.cleaner.config = config
        self._stopping = False
        self._stop = asyncio.Event()
        self.start()

    def start(self) -> None:
        if not self.config.enable_cleaner:
            return
        for index in range(self.config.num_threads):
            self._tasks.append(asyncio.create_task(self._run(), name=f"kafka-log-cleaner-thread-{index}"))

    async def stop(self) -> None:
        """Stop every loop; a clean in progress stops at its next batch and leaves the log as it was."""
        self._stopping = True
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def _check_done(self) -> None:
        if self._stopping:
            raise LogCleaningAbortedError("the broker is shutting down")

    async def _run(self) -> None:
        while not self._stopping:
            try:
                cleaned = await self.clean_once()
            except Exception:
                logger.exception("The log cleaner failed; retrying after log.cleaner.backoff.ms")
                cleaned = False
            if not cleaned:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.config.backoff_ms / 1000):
                        await self._stop.wait()

    async def clean_once(self) -> bool:
        """Clean the dirtiest log, if any needs it; whether a clean took effect."""
        cleaner = self.cleaner
        task = cleaner.grab(now_ms())
        if task is None:
            return False
        try:
            result = await asyncio.to_thread(task.run, self._check_done)
        except LogCleaningAbortedError as e:
            logger.info("Log cleaning of %s aborted: %s", task.to_clean.topic_partition, e)
            cleaner.abort(task)
            return False
        except Exception:
            self._failed(task)
            return False
        if self._stopping:
            cleaner.abort(task, result)
            return False
        return cleaner.complete(task, result)

    def _failed(self, task: CleaningTask) -> None:
        """Kafka's LogCleaningException: a log whose data the cleaner cannot read is not cleaned again until
        the broker restarts; a log that merely changed under the clean is tried again later."""
        tp = task.to_clean.topic_partition
        if self.cleaner.unchanged(task):
            logger.exception("Unexpected error while cleaning %s; it is marked uncleanable", tp)
            self.cleaner.abort(task, uncleanable=True)
        else:
            logger.info("Log cleaning of %s aborted: the log changed while it was cleaned", tp)
            self.cleaner.abort(task)

    def _register_metrics(self, registry: CollectorRegistry) -> None:
        cleaner = self.cleaner
        totals = cleaner.totals

        def counter(name: str, help: str) -> ScrapedMetric:
            return ScrapedMetric("counter", f"tierlog_log_cleaner_{name}_total", help)

        registry.register(
            ScrapeCollector(
                [
                    counter("cleanings", "Cleans swapped into their log.").callback(lambda: cleaner.cleanings),
                    counter("aborted", "Cleans given up (log changed, broker stopping, bad data).").callback(
                        lambda: cleaner.aborted
                    ),
                    counter("bytes_read", "Bytes of segments the cleaner rewrote.").callback(lambda: totals.bytes_read),
                    counter("bytes_written", "Bytes of the segments it wrote in their place.").callback(
                        lambda: totals.bytes_written
                    ),
                    counter("records_read", "Records of the segments the cleaner rewrote.").callback(
                        lambda: totals.messages_read
                    ),
                    counter("records_kept", "Records it kept of them.").callback(lambda: totals.messages_written),
                    ScrapedMetric(
                        "gauge",
                        "kafka_log_logcleanermanager_max_dirty_percent",
                        "Dirty share of the dirtiest compacted log.",
                    ).callback(lambda: 100 * cleaner.manager.dirtiest_log_cleanable_ratio),
                    ScrapedMetric(
                        "gauge",
                        "kafka_log_logcleanermanager_max_compaction_delay_secs",
                        "How far past max.compaction.lag.ms the most overdue compacted log is.",
                    ).callback(lambda: cleaner.manager.max_compaction_delay_ms / 1000),
                    ScrapedMetric(
                        "gauge",
                        "kafka_log_logcleanermanager_uncleanable_partitions_count",
                        "Partitions the cleaner gave up on after an error (until restart).",
                    ).callback(lambda: len(cleaner.manager.uncleanable)),
                ]
            )
        )
