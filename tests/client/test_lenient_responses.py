"""Responses kio refuses but Kafka's brokers send: DescribeTransactions' start time -1 (no transaction has started)
is read as -1, any other as the epoch milliseconds it is."""

from __future__ import annotations

import datetime

from tierlog.client.requests import describe_transactions_request
from tierlog.client.wire import decode_response
from tierlog.protocol.codec import Request, encode_response
from tierlog.protocol.errors import error_code
from tierlog.server.entities import response_schema


def test_describe_transactions_reads_a_start_time_of_minus_one() -> None:
    s = response_schema(65, 0)
    request = describe_transactions_request(["never-began", "running"])

    def state(transactional_id: str, start_ms: int) -> object:
        return s.TransactionState(
            error_code=error_code(None),
            transactional_id=transactional_id,
            transaction_state="Empty" if start_ms < 0 else "Ongoing",
            transaction_timeout=datetime.timedelta(seconds=60),
            transaction_start_time=datetime.datetime.fromtimestamp(start_ms / 1000, tz=datetime.UTC),
            producer_id=7,
            producer_epoch=0,
            topics=(s.TopicData(topic="orders", partitions=(1,)),) if start_ms >= 0 else (),
        )

    response = s.DescribeTransactionsResponse(
        throttle_time=datetime.timedelta(0), transaction_states=(state("never-began", -1), state("running", 1700))
    )
    frames = encode_response(Request(65, 0, 42, "tool", request, 0), response)
    frame = b"".join(bytes(chunk) for chunk in frames)[4:]
    decoded = decode_response(request, 42, frame)
    assert [(t.transactional_id, t.transaction_start_time_ms) for t in decoded.transaction_states] == [
        ("never-began", -1),
        ("running", 1700),
    ]
    assert [(t.topic, t.partitions) for t in decoded.transaction_states[1].topics] == [("orders", (1,))]
