"""The list of Rewind's PySpark data sources that :func:`rewind.spark.register` installs."""

from __future__ import annotations

DATA_SOURCES: list[type] = []
