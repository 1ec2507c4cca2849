"""Tables of a source of truth, read for re-producing current-state messages.

The seed pattern "backfilling": the upstream service re-produces current-state messages for a
limited set of entities, built from its database. ``source.table`` names the table (PostgreSQL
or SQLite through SQLAlchemy, or Iceberg through pyiceberg), the entity id column and the
selection; this package plans and reads it:

* ``readers``: the one small interface over the three databases (check, count, sorted keys,
  rows of a key range in key order), with ``sql`` and ``iceberg`` behind it;
* ``selection``: the ids of a spec (a list, or a file pinned by its digest) checked against the
  key column's type;
* ``placement``: which partition each selected entity lands on, ``skip_partitions`` and the
  stuck-partition warning;
* ``plan``: a table source's part of ``rewind plan`` (gates, work units by key range, sample),
  handed to the job plan as a ``table_plan.TablePlan``;
* ``records``: rows as Kafka-shaped records for the translate (key = entity id, value = JSON);
* ``stage``: the Spark stage of a wave (tasks read their key ranges and produce them).

The job layer passes the stage what it may not import itself (the Kafka sink's unit writer).
Design and worked example: docs/reproduce.md.
"""
