"""Options and record layout of the ``rewind-kafka`` writer, checked on the driver before any task starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rewind.errors import ConfigError, RewindError
from rewind.spark.kafka_options import flag, positive_float, positive_int
from rewind.spark.ratelimit import (
    RateLimit,
)

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType


FORMAT_NAME = "rewind-kafka"
PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "linger.ms": 20,
    "queue.buffering.max.messages": 200_000,
    "partitioner": "murmur2_random",
    "delivery.report.only.error": True,
}
"""Producer settings Rewind picks over librdkafka's; any ``kafka.*`` option overrides them."""
TRANSACTIONAL_DEFAULTS: dict[str, Any] = {"transaction.timeout.ms": 600_000}
_KNOWN_COLUMNS = ("topic", "key", "value", "headers", "partition", "timestamp")


class KafkaWriteError(RewindError):
    """Kafka refused records, or the producer failed; the task (and so the job) fails."""


@dataclass(frozen=True)
class WriterOptions:
    """The writer's options, parsed and checked once on the driver."""

    producer_conf: dict[str, Any]
    topic: str | None = None
    transactional: bool = False
    transactional_id_prefix: str | None = None
    limit: RateLimit = field(default_factory=RateLimit)
    num_tasks: int | None = None
    rate_limit_dir: str | None = None
    rate_limit_server: str | None = None
    """A :class:`~rewind.spark.pace_server.PaceAddress` (JSON): the driver keeps the job's budget."""
    summary_path: str | None = None
    ignore_extra_columns: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriterOptions:
        """Parse Spark's (case-insensitive) options; a bad one is a :class:`ConfigError`."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        kafka = {k[len("kafka.") :]: v for k, v in opts.items() if k.startswith("kafka.")}
        if not kafka.get("bootstrap.servers", "").strip():
            raise ConfigError(
                "option kafka.bootstrap.servers is required for format "
                f"{FORMAT_NAME!r}: .option('kafka.bootstrap.servers', 'host:9092')"
            )
        transactional = flag(opts, "transactional")
        prefix = opts.get("transactionalidprefix") or None
        run_id = opts.get("runid") or None
        if transactional and prefix is None:
            if run_id is None:
                raise ConfigError(
                    "option transactional=true needs option runId or transactionalIdPrefix: "
                    "transactional ids must be stable across task retries and differ between runs"
                )
            prefix = f"rewind-{run_id}"
        producer_conf: dict[str, Any] = {**PRODUCER_DEFAULTS}
        if transactional:
            producer_conf.update(TRANSACTIONAL_DEFAULTS)
        producer_conf.update(kafka)
        if "transactional.id" in kafka:
            raise ConfigError(
                "option kafka.transactional.id is set per task by Rewind; use transactional=true "
                "with runId or transactionalIdPrefix instead"
            )
        try:
            limit = RateLimit(
                positive_float(opts, "maxrecordspersecond"), positive_float(opts, "maxbytespersecond")
            )
        except ValueError as exc:
            raise ConfigError(f"bad rate limit option: {exc}") from None
        num_tasks = positive_int(opts, "numtasks")
        return cls(
            producer_conf=producer_conf,
            topic=opts.get("topic") or None,
            transactional=transactional,
            transactional_id_prefix=prefix,
            limit=limit,
            num_tasks=num_tasks,
            rate_limit_dir=opts.get("ratelimitdir") or None,
            rate_limit_server=opts.get("ratelimitserver") or None,
            summary_path=opts.get("summarypath") or None,
            ignore_extra_columns=flag(opts, "ignoreextracolumns"),
        )


TimestampKind = Literal["none", "timestamp", "seconds"]


@dataclass(frozen=True)
class RecordLayout:
    """Which of Spark's Kafka sink columns the DataFrame has (checked on the driver)."""

    topic_column: bool
    key: bool
    headers: bool
    partition: bool
    timestamp: TimestampKind

    @classmethod
    def from_schema(cls, schema: StructType, options: WriterOptions) -> RecordLayout:
        """Check the DataFrame's columns against Spark's Kafka sink rules."""
        # lazy: avoids pyspark at import
        from pyspark.sql.types import (
            ArrayType,
            BinaryType,
            ByteType,
            DoubleType,
            IntegerType,
            ShortType,
            StringType,
            StructType,
            TimestampType,
        )

        fields = {f.name: f.dataType for f in schema.fields}
        extra = [name for name in fields if name not in _KNOWN_COLUMNS]
        if extra and not options.ignore_extra_columns:
            raise ConfigError(
                f"column(s) {', '.join(map(repr, extra))} cannot be written to Kafka; the writer "
                f"takes only {', '.join(_KNOWN_COLUMNS)} (select those columns, or set option "
                "ignoreExtraColumns=true)"
            )

        def check(name: str, allowed: tuple[type, ...], wanted: str) -> DataType | None:
            dtype = fields.get(name)
            if dtype is not None and not isinstance(dtype, allowed):
                raise ConfigError(f"column {name!r} has type {dtype.simpleString()}; it must be {wanted}")
            return dtype

        if "value" not in fields:
            raise ConfigError("required column 'value' (binary or string) not found")
        check("value", (BinaryType, StringType), "binary or string")
        check("key", (BinaryType, StringType), "binary or string")
        check("partition", (IntegerType, ShortType, ByteType), "int")
        ts = check("timestamp", (TimestampType, DoubleType), "timestamp or double (seconds)")
        topic = check("topic", (StringType,), "string")
        if options.topic is None and topic is None:
            raise ConfigError("no topic: set option topic, or give the DataFrame a string column 'topic'")
        headers = fields.get("headers")
        if headers is not None:
            element = headers.elementType if isinstance(headers, ArrayType) else None
            names = [f.name for f in element.fields] if isinstance(element, StructType) else []
            ok = (
                isinstance(element, StructType)
                and names == ["key", "value"]
                and isinstance(element["key"].dataType, StringType)
                and isinstance(element["value"].dataType, (BinaryType, StringType))
            )
            if not ok:
                raise ConfigError(
                    f"column 'headers' has type {headers.simpleString()}; it must be "
                    "array<struct<key: string, value: binary>>"
                )
        timestamp: TimestampKind = "none"
        if ts is not None:
            timestamp = "seconds" if isinstance(ts, DoubleType) else "timestamp"
        return cls(
            topic_column=topic is not None and options.topic is None,
            key="key" in fields,
            headers=headers is not None,
            partition="partition" in fields,
            timestamp=timestamp,
        )
