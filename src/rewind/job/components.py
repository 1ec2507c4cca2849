"""Turning a spec into its staging sink and its quarantine table.

The translate's parts (decoder, function, output schema) come from :mod:`rewind.translate.factory`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewind.catalog import load_catalog
from rewind.errors import ConfigError
from rewind.sinks.iceberg import IcebergSink
from rewind.sinks.iceberg.shadow import IcebergShadowSink
from rewind.sinks.kafka.sink import KafkaTopicSink
from rewind.sinks.sql.sink import SqlSink

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.sinks.base import StagingSink
    from rewind.spec import JobSpec


def make_sink(settings: Settings, spec: JobSpec) -> StagingSink[Any]:
    """The staging sink of a spec (each kind imported only when used)."""
    if spec.sink.iceberg is not None:
        ice = spec.sink.iceberg
        if spec.shadow is not None:  # v2: a new table upserted on the key, swapped in at cutover
            return IcebergShadowSink(load_catalog(settings), ice.table, list(spec.key))
        window = spec.replaced_window()
        return IcebergSink(load_catalog(settings), ice.table, ice.mode, ice.window_column, window)
    if spec.sink.postgres is not None:
        return SqlSink.from_spec(settings, spec)
    if spec.sink.kafka is not None:
        return KafkaTopicSink.from_spec(settings, spec)
    raise ConfigError(f"sink.{spec.sink.kind}: no such sink")


def quarantine_table(spec: JobSpec) -> str:
    if spec.quarantine.table:
        return spec.quarantine.table
    if spec.sink.iceberg is not None:
        namespace = spec.sink.iceberg.table.rpartition(".")[0]
        return f"{namespace}.rewind_quarantine"
    return "rewind.rewind_quarantine"
