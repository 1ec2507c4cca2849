"""The SQL sink: a staging table beside the target on PostgreSQL or SQLite, swapped in by renames.

``sink`` holds the sink and its protocol (read its docstring first); ``backend`` is the one
interface over the two databases, implemented by ``postgres`` and ``sqlite``; ``names``,
``types`` and ``encoding`` are the table names, the type mapping and the COPY encoding.
"""
