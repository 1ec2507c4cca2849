"""Rewind: safe, fast, repeatable backfills and replays of Kafka event streams on Spark."""

import logging

__version__ = "0.1.0"

# a library stays silent unless its user configures logging (the CLI does)
logging.getLogger("rewind").addHandler(logging.NullHandler())
