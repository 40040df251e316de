"""Response schemas tierlog's client reads in place of kio's where kio refuses what Kafka's brokers send.

DescribeTransactions' TransactionStartTimeMs is -1 when no transaction has started (an id in Empty state, as Kafka's
coordinator answers it); kio types it as a timestamp and its reader refuses a negative one. Here it is the plain
int64 Kafka's schema has, read by kio's own entity reader. No `from __future__ import annotations`: kio reads the
field types off the dataclasses.
"""

from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.describe_transactions.v0.response import TopicData
from kio.schema.errors import ErrorCode
from kio.schema.response_header.v1.header import ResponseHeader
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32Timedelta, i64

API_DESCRIBE_TRANSACTIONS = 65


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionState:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(API_DESCRIBE_TRANSACTIONS)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    transactional_id: str = field(metadata={"kafka_type": "string"})
    transaction_state: str = field(metadata={"kafka_type": "string"})
    transaction_timeout: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    transaction_start_time_ms: i64 = field(metadata={"kafka_type": "int64"})
    producer_id: i64 = field(metadata={"kafka_type": "int64"})
    producer_epoch: i16 = field(metadata={"kafka_type": "int16"})
    topics: tuple[TopicData, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeTransactionsResponse:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(API_DESCRIBE_TRANSACTIONS)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    transaction_states: tuple[TransactionState, ...]


# (api key, version) -> the schema read instead of kio's
LENIENT_RESPONSES: dict[tuple[int, int], type] = {(API_DESCRIBE_TRANSACTIONS, 0): DescribeTransactionsResponse}
