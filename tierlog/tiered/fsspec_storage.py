"""A RemoteStorageManager on fsspec: one code path for `file://`, `memory://` and `s3://` remote tiers.

Objects are named as Kafka's LocalTieredStorage names its files, one directory per partition:

    <root>/<topic>-<partition>-<topic id>/<start offset, 20 digits>-<segment uuid><suffix>

with `.log` for the segment and `IndexType.value` (`.index`, `.timeindex`, `.txnindex`,
`.leader_epoch_checkpoint`, `.snapshot`) for the rest. The segment uuid is new for every copy, so two
leaders (or a retried copy) uploading the same offsets never overwrite each other's objects; which copy
counts is the RemoteLogMetadataManager's business, not the store's.

Brokers configure it with Kafka's `rsm.config.*` properties (see `from_config`). Every call blocks and is
made from worker threads, several at a time: for S3 one s3fs filesystem per manager runs its requests on
fsspec's own event-loop thread, and every blocking call hands its coroutine to that loop, which is safe
from any number of threads.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import fsspec
from fsspec.spec import AbstractFileSystem

from tierlog.tiered.remote_storage_manager import (
    IndexType,
    LogSegmentData,
    RemoteResourceNotFoundError,
    RemoteStorageError,
)
from tierlog.tiered.segment_metadata import RemoteLogSegmentMetadata

URL_SETTING = "rsm.config.url"
SUPPORTED_SCHEMES = ("file", "memory", "s3")
LOG_SUFFIX = ".log"

# An outage must surface as a RemoteStorageError within seconds, not after botocore's default minute-long
# waits and s3fs's own five retries stacked on top: the caller (the RemoteLogManager) retries later anyway.
S3_CONNECT_TIMEOUT_S = 5
# Per socket read, not per request: a 1 GiB ranged read that keeps streaming is never cut off, while a
# server that stops answering fails a call after S3_MAX_ATTEMPTS x 15 s (s3fs's own default read timeout),
# within a Kafka client's default request.timeout.ms of 30 s. A dead server (connection refused) fails it
# in well under a second.
S3_READ_TIMEOUT_S = 15
S3_MAX_ATTEMPTS = 2
DEFAULT_S3_REGION = "us-east-1"
# s3fs uploads a file below 2 parts in one PUT read whole into memory, and a larger one in parts,
# `max_concurrency` of them in flight: 8 MiB parts x 4 bound one upload to 32 MiB of memory whatever the
# segment size (s3fs's defaults, 50 MiB x 10, would hold 500 MiB).
S3_UPLOAD_PART_BYTES = 8 * 1024 * 1024
S3_MAX_CONCURRENCY = 4

_MAX_MESSAGE_CHARS = 300


class FsspecRemoteStorageManager:
    """KIP-405 RemoteStorageManager over one fsspec filesystem rooted at `url`.

    `storage_options` go to the fsspec filesystem; for `s3://` they are merged over this module's
    defaults (path-style addressing, region us-east-1, no listings cache, a private filesystem instance,
    short timeouts and few retries), so passing just `endpoint_url`, `key` and `secret` is enough.
    """

    def __init__(self, url: str, storage_options: Mapping[str, object] | None = None) -> None:
        scheme = _scheme_of(url)
        options: dict[str, Any] = dict(storage_options or {})
        self._put_options: dict[str, Any] = {}
        if scheme == "s3":
            options = _s3_options(options)
            self._put_options = {"chunksize": S3_UPLOAD_PART_BYTES}
        elif scheme == "file":
            # Partition directories appear with their first object, as prefixes do on S3.
            options.setdefault("auto_mkdir", True)
        self.url = url
        self.scheme = scheme
        fs, root = fsspec.core.url_to_fs(url, **options)
        self._fs: AbstractFileSystem = fs
        self._root = root.rstrip("/")
        self._closed = False
        if scheme == "s3":
            # s3fs only tries each request once itself here (botocore does the retrying, bounded above);
            # its default of five s3fs-level retries would multiply every timeout by five.
            self._fs.retries = 1
            # Create the client now (no network I/O): a bad option fails here, in the constructor, and the
            # first calls from several threads do not race to set it up.
            self._fs.connect()

    @classmethod
    def from_config(cls, props: Mapping[str, str]) -> FsspecRemoteStorageManager:
        """Build from the RSM's settings with Kafka's `rsm.config.` prefix already stripped:

        - `url` (required): `s3://bucket/prefix`, `file:///abs/path` or `memory://name`
        - `s3.endpoint.url`: for S3-compatible servers (SeaweedFS, MinIO); AWS when unset
        - `s3.region` (default us-east-1), `aws.access.key.id`, `aws.secret.access.key` (botocore's own
          credential chain when unset)
        """
        url = (props.get("url") or "").strip()
        if not url:
            raise ValueError(
                f"{URL_SETTING} is not set: give the remote tier's location, e.g. s3://bucket/prefix, "
                "file:///abs/path or memory://name"
            )
        options: dict[str, object] = {}
        if _scheme_of(url) == "s3":
            endpoint = (props.get("s3.endpoint.url") or "").strip()
            if endpoint:
                options["endpoint_url"] = endpoint
            options["client_kwargs"] = {"region_name": (props.get("s3.region") or "").strip() or DEFAULT_S3_REGION}
            key = (props.get("aws.access.key.id") or "").strip()
            secret = (props.get("aws.secret.access.key") or "").strip()
            if key:
                options["key"] = key
            if secret:
                options["secret"] = secret
        return cls(url, options)

    # -- RemoteStorageManager ----------------------------------------------------------------------

    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> None:
        self._check_open()
        base = self._object_base(metadata)
        index_files = {
            IndexType.OFFSET: data.offset_index,
            IndexType.TIMESTAMP: data.time_index,
            IndexType.TRANSACTION: data.transaction_index,
            IndexType.PRODUCER_SNAPSHOT: data.producer_snapshot,
        }
        for index_type, local in index_files.items():
            if local is not None:
                self._upload(local, base + index_type.value)
        epoch_path = base + IndexType.LEADER_EPOCH.value
        with self._remote_call("copy leader epoch checkpoint to", epoch_path, missing_is_not_found=False):
            self._fs.pipe_file(epoch_path, data.leader_epoch_checkpoint)
        # Last: a segment whose `.log` exists had every other object uploaded before it.
        self._upload(data.log_segment, base + LOG_SUFFIX)

    def fetch_log_segment(self, metadata: RemoteLogSegmentMetadata, start_position: int, end_position: int) -> bytes:
        if start_position < 0 or end_position < start_position:
            raise ValueError(f"invalid segment byte range [{start_position}, {end_position})")
        self._check_open()
        path = self._object_base(metadata) + LOG_SUFFIX
        with self._remote_call("fetch", path):
            if end_position == start_position:
                # Nothing to read, but a missing segment is still an error.
                self._fs.info(path)
                return b""
            try:
                return bytes(self._fs.cat_file(path, start=start_position, end=end_position))
            except OSError as exc:
                # S3 refuses a range that starts at or past the end (416, which s3fs raises as EINVAL) where
                # files just return nothing. Only that error is worth a look at the size: a timeout (also an
                # OSError) would only time out once more.
                if exc.errno == errno.EINVAL and start_position >= self._fs.size(path):
                    return b""
                raise

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        self._check_open()
        path = self._object_base(metadata) + index_type.value
        with self._remote_call(f"fetch {index_type.name.lower()} index", path):
            return bytes(self._fs.cat_file(path))

    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        self._check_open()
        base = self._object_base(metadata)
        # The log first, so a delete that fails half-way never leaves a `.log` without its indexes.
        for suffix in (LOG_SUFFIX, *(index_type.value for index_type in IndexType)):
            path = base + suffix
            # Gone already (deleted before, or never uploaded by a copy that failed half-way) is fine.
            with self._remote_call("delete", path, missing_is_not_found=False), suppress(FileNotFoundError):
                self._fs.rm_file(path)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.scheme == "s3":
            # Closes the aiohttp connection pool now rather than at garbage collection (which warns).
            creator = getattr(self._fs, "_s3creator", None)
            if creator is not None:
                self._fs.close_session(self._fs.loop, creator)

    # -- beyond the interface ------------------------------------------------------------------------

    def list_segment_objects(self) -> list[str]:
        """Every object under the root, relative to it, sorted: `<partition dir>/<object name>`. A flat
        listing: on S3 one ListObjectsV2 walk with no delimiter, so prefixes left empty by deletes (which
        S3-compatible stores may keep reporting as "directories") do not show up."""
        self._check_open()
        with self._remote_call("list", self._root, missing_is_not_found=False):
            try:
                found = self._fs.find(self._root)
            except FileNotFoundError:
                return []
        prefix = self._root + "/"
        return sorted(path[len(prefix) :] for path in found if path.startswith(prefix))

    def check_access(self) -> None:
        """One cheap request proving the store answers, accepts the credentials and has the bucket (S3:
        HeadBucket), so a reader can fail at once rather than in the middle of its work. A file:// or memory://
        root needs no check: a root the brokers have not created yet only means nothing was copied."""
        self._check_open()
        if self.scheme != "s3":
            return
        bucket = self._root.split("/", 1)[0]
        with self._remote_call("check bucket", bucket, missing_is_not_found=False):
            self._fs.info(bucket)

    def __enter__(self) -> FsspecRemoteStorageManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FsspecRemoteStorageManager({self.url!r})"

    # -- internals ---------------------------------------------------------------------------------

    def _object_base(self, metadata: RemoteLogSegmentMetadata) -> str:
        segment_id = metadata.segment_id
        topic_id = segment_id.topic_id_partition.topic_id
        partition_dir = f"{segment_id.topic_partition}-{topic_id}"
        return f"{self._root}/{partition_dir}/{metadata.start_offset:020d}-{segment_id.id}"

    def _upload(self, local: Path, path: str) -> None:
        # put_file streams: the local file is read in blocks (S3: in parts), never whole into memory.
        with self._remote_call(f"copy {local} to", path, missing_is_not_found=False):
            self._fs.put_file(str(local), path, **self._put_options)

    def _check_open(self) -> None:
        if self._closed:
            raise RemoteStorageError(f"the remote storage manager for {self.url} is closed")

    def _display(self, path: str) -> str:
        return str(self._fs.unstrip_protocol(path))

    @contextmanager
    def _remote_call(self, action: str, path: str, *, missing_is_not_found: bool = True) -> Iterator[None]:
        """Translate whatever fsspec, s3fs, botocore or aiohttp raised into the interface's two errors, with
        a one-line message (the original stays chained as __cause__)."""
        try:
            yield
        except RemoteStorageError:
            raise
        except FileNotFoundError as exc:
            message = f"{action} {self._display(path)} failed: not found ({_one_line(exc)})"
            if missing_is_not_found:
                raise RemoteResourceNotFoundError(message) from exc
            raise RemoteStorageError(message) from exc
        except Exception as exc:
            # Connection refused, timeouts, 5xx, access denied, a closed loop: all retriable from the
            # caller's point of view, which is all RemoteStorageError promises.
            raise RemoteStorageError(f"{action} {self._display(path)} failed: {_one_line(exc)}") from exc


def _scheme_of(url: str) -> str:
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SUPPORTED_SCHEMES:
        supported = ", ".join(f"{name}://" for name in SUPPORTED_SCHEMES)
        raise ValueError(f"{URL_SETTING}={url!r} is not supported: use a {supported} URL")
    return scheme


def _s3_options(user: Mapping[str, Any]) -> dict[str, Any]:
    """s3fs options: ours, with whatever the caller passed on top (nested config dicts merged key by key)."""
    options: dict[str, Any] = {
        # Listings must see objects written a moment ago (by this broker or another) and a manager must
        # not share a cached instance, and so its credentials and event-loop state, with another.
        "use_listings_cache": False,
        "skip_instance_cache": True,
        "max_concurrency": S3_MAX_CONCURRENCY,
        **user,
    }
    user_config: dict[str, Any] = dict(user.get("config_kwargs") or {})
    # S3-compatible servers on an IP and port (SeaweedFS, MinIO) only understand path-style addressing.
    s3_config = {"addressing_style": "path", **(user_config.pop("s3", None) or {})}
    options["config_kwargs"] = {
        "connect_timeout": S3_CONNECT_TIMEOUT_S,
        "read_timeout": S3_READ_TIMEOUT_S,
        "retries": {"total_max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"},
        **user_config,
        "s3": s3_config,
    }
    options["client_kwargs"] = {"region_name": DEFAULT_S3_REGION, **(user.get("client_kwargs") or {})}
    return options


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if not text:
        return type(exc).__name__
    if len(text) > _MAX_MESSAGE_CHARS:
        text = text[: _MAX_MESSAGE_CHARS - 3] + "..."
    return f"{type(exc).__name__}: {text}"
