"""The list of Rewind's PySpark data sources that :func:`rewind.spark.register` installs."""

from __future__ import annotations

from rewind.spark.kafka_source import KafkaDataSource

DATA_SOURCES: list[type] = [KafkaDataSource]
