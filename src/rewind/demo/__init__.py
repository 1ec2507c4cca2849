"""The demo: a production repair of a read model, end to end (``rewind demo``)."""
