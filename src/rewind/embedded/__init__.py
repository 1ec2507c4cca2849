"""The local stack: a Kafka-protocol broker, an Iceberg SQL catalog and the run ledger."""

from rewind.embedded.stack import PartStatus, Stack

__all__ = ["PartStatus", "Stack"]
