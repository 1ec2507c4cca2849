"""All Spark code lives here: the session factory and the Python data sources."""

from rewind.spark.session import register, session

__all__ = ["register", "session"]
