"""The list of Rewind's PySpark data sources that :func:`rewind.spark.register` installs."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from rewind.spark.kafka_source import KafkaDataSource

DATA_SOURCES: list[type[DataSource]] = [KafkaDataSource]
