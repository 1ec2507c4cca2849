"""The Kafka topic sink: a run's output staged on a backfill topic, published to consumers.

``sink`` holds the sink and its protocol (read its docstring first); ``records`` turns output
rows into Kafka records and back; ``commit_writer`` produces one commit; ``bookkeeping`` reads
and writes the ``rewind.commits`` topic; ``topics`` holds the admin helpers.
"""
