"""``rewind shadow``: migrate a read model to a v2 rebuilt from history while v1 stays live.

``start`` runs the job's history plan into v2 (the run's staging) and then follows the live
topic with a streaming query (:mod:`rewind.shadow.tail`); ``lag`` measures how far the
shadow is behind the log and the live consumer group and says when it is caught up.
"""
