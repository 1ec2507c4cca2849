"""The one producer wrapper every writer uses, against each test broker (tests/brokers.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from rewind.errors import RewindError
from rewind.kafka.producer import ProducerFailed, TransactionalProducer
from tests.brokers import READ_COMMITTED, TestBroker
from tests.conftest import free_port
from tests.kafka_util import create_topic


class WriterError(RewindError):
    pass


def read_all(conf: dict[str, Any], topic: str) -> list[bytes]:
    group = f"g-{uuid.uuid4().hex[:6]}"
    consumer = Consumer({**conf, "group.id": group, "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        while (msg := consumer.poll(3)) is not None:
            if not msg.error():
                out.append(msg.value() or b"")
        return out
    finally:
        consumer.close()


def test_a_transactional_write_is_read_back_once(broker_conf: dict[str, Any], topic_name: str) -> None:
    create_topic(broker_conf, topic_name, 1)
    txn = TransactionalProducer(dict(broker_conf), transactional_id=f"t-{topic_name}", error=WriterError)
    assert txn.client is None  # nothing is built, nothing is asked of the network, before open()
    client = txn.open()
    try:
        txn.begin()
        for i in range(50):
            client.produce(topic_name, f"v{i}".encode(), partition=0)
        txn.flush()
        txn.commit()
        assert not txn.in_transaction and txn.failed == 0
    finally:
        txn.close()
    values = read_all(dict(broker_conf), topic_name)
    assert values == [f"v{i}".encode() for i in range(50)]


def test_an_aborted_transaction_is_never_read_committed(
    broker: TestBroker, broker_conf: dict[str, Any], topic_name: str
) -> None:
    """Records flushed to the log and then aborted: a read_committed reader sees only the
    committed transaction after them."""
    broker.require(READ_COMMITTED)
    create_topic(broker_conf, topic_name, 1)
    txn = TransactionalProducer(dict(broker_conf), transactional_id=f"t-{topic_name}", error=WriterError)
    client = txn.open()
    try:
        for outcome in ("aborted", "committed"):
            txn.begin()
            for i in range(20):
                client.produce(topic_name, f"{outcome}-{i}".encode(), partition=0)
            txn.flush()  # in the log before the outcome
            if outcome == "aborted":
                txn.abort()
            else:
                txn.commit()
    finally:
        txn.close()
    assert read_all(dict(broker_conf), topic_name) == [f"committed-{i}".encode() for i in range(20)]


def test_records_that_cannot_be_delivered_raise_the_callers_error() -> None:
    conf = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "message.timeout.ms": 60_000}
    txn = TransactionalProducer(conf)
    client = txn.open()
    try:
        client.produce("nowhere", b"x")
        with pytest.raises(ProducerFailed, match=r"1 record\(s\) not delivered in 2s"):
            txn.flush(timeout_s=2)
    finally:
        txn.abort()
        txn.close()
    assert txn.client is None


def test_a_failed_transaction_step_names_the_step_and_the_id() -> None:
    conf = {"bootstrap.servers": f"127.0.0.1:{free_port()}"}
    txn = TransactionalProducer(conf, transactional_id="t-nowhere", error=WriterError, call_timeout_s=2)
    with pytest.raises(WriterError, match="init_transactions failed for transactional id t-nowhere"):
        txn.open()
    txn.close()
