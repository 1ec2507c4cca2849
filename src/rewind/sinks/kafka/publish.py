"""Publication of a run's backfill topic: the published/withdrawn/deleted records, and cleanup."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from rewind import faults
from rewind.core.store import remove_tree
from rewind.kafka.clients import admin as make_admin
from rewind.sinks.base import Swap
from rewind.sinks.kafka.bookkeeping import (
    KafkaStaging,
    now_iso,
    published_view,
    short_error,
    staged_run_log,
    write_bookkeeping,
)
from rewind.sinks.kafka.exceptions import KafkaSinkError
from rewind.sinks.kafka.held import check_held
from rewind.sinks.kafka.topics import (
    TIMEOUT_S,
    high_watermarks,
    topic_is_there,
    wait_until,
)

log = logging.getLogger(__name__)


class PublishingTopicSink(Protocol):
    """What promotion, withdrawal and cleanup need of the sink (a
    :class:`~rewind.sinks.kafka.sink.KafkaTopicSink`): the sink calls this module, so this
    module names only what it reads and never imports the sink back."""

    conf: dict[str, Any]
    spool_dir: str

    @property
    def target(self) -> str: ...


def promote_topic(sink: PublishingTopicSink, staging: KafkaStaging) -> Swap:
    """Record the topic with its end offsets as ``published``; idempotent.

    Steps: (1) read the run's bookkeeping; already published → nothing to do; (2) the true
    high watermarks of the topic (a fetch, not ListOffsets ``latest``, which some brokers
    under-report); (3) check the topic still holds every committed record (:mod:`.held`:
    nothing removed from its front, nothing lost from its tail, offsets for every row); (4)
    write the ``published`` record.
    """
    runlog = staged_run_log(sink.conf, staging)
    before = runlog.publication
    if runlog.state == "published":
        return Swap(sink.target, "promote", None, published_view(before), True)
    if runlog.state == "deleted":
        raise KafkaSinkError(f"topic {staging.topic} was deleted by `rewind cleanup`; nothing to promote")
    if not topic_is_there(sink.conf, staging.topic):
        raise KafkaSinkError(f"topic {staging.topic} does not exist; nothing to promote")
    check_held(sink.conf, staging, runlog)
    ends = high_watermarks(sink.conf, staging.topic)
    publication = {
        "kind": "publication",
        "state": "published",
        "run_id": staging.run_id,
        "topic": staging.topic,
        "partitions": staging.partitions,
        "start_offsets": {str(p): o for p, o in sorted(staging.start_offsets.items())},
        "end_offsets": {str(p): o for p, o in sorted(ends.items())},
        "records": runlog.rows,
        "commits": len(runlog.commits),
        "read_committed": staging.read_committed,
        "transactional": staging.transactional,
        "at": now_iso(),
    }
    write_publication(sink, staging, publication, "promote")
    return Swap(sink.target, "promote", published_view(before), published_view(publication), False)


def withdraw_topic(sink: PublishingTopicSink, staging: KafkaStaging, promoted: dict[str, Any]) -> Swap:
    """Record the topic as ``withdrawn``; idempotent. The topic stays until ``rewind cleanup``."""
    runlog = staged_run_log(sink.conf, staging)
    after = {"topic": staging.topic, "state": "withdrawn"}
    if runlog.state in ("withdrawn", "deleted"):
        return Swap(sink.target, "rollback", promoted.get("after"), after, True)
    withdrawn = {
        "kind": "publication",
        "state": "withdrawn",
        "run_id": staging.run_id,
        "topic": staging.topic,
        "withdrawn": runlog.publication,
        "at": now_iso(),
    }
    write_publication(sink, staging, withdrawn, "rollback")
    return Swap(sink.target, "rollback", promoted.get("after"), after, False)


def write_publication(
    sink: PublishingTopicSink, staging: KafkaStaging, record: dict[str, Any], action: str
) -> None:
    """Write the run's publication record (the one durable step of a promote or rollback)
    between the fault points ``kafka-<action>-before-commit`` and ``-after-commit``."""
    faults.point(f"kafka-{action}-before-commit")
    write_bookkeeping(sink.conf, staging.bookkeeping, f"{staging.run_id}/publication", record)
    faults.point(f"kafka-{action}-after-commit")


def cleanup_topic(sink: PublishingTopicSink, staging: KafkaStaging) -> dict[str, Any]:
    """Delete the run's topic and spool files; refused while the topic is published.

    Only a topic Rewind created for the run is deleted (one that existed before, empty, is
    left to its owner). The run's bookkeeping stays, marked ``deleted``, so the run cannot
    be resumed or promoted into a missing topic. Idempotent.
    """
    runlog = staged_run_log(sink.conf, staging)
    if runlog.state == "published":
        raise KafkaSinkError(
            f"topic {staging.topic} is published (consumers may be reading it); "
            f"`rewind rollback {staging.run_id}` first, then clean up"
        )
    exists = topic_is_there(sink.conf, staging.topic)
    deleted = False
    if exists and staging.created:
        admin = make_admin(sink.conf)
        try:
            for fut in admin.delete_topics([staging.topic], operation_timeout=TIMEOUT_S).values():
                fut.result(timeout=TIMEOUT_S)
        except Exception as exc:
            raise KafkaSinkError(f"could not delete topic {staging.topic}: {short_error(exc)}") from exc
        wait_until(lambda: not topic_is_there(sink.conf, staging.topic), f"topic {staging.topic} deleted")
        deleted = True
    spool_removed = remove_tree(f"{sink.spool_dir}/{staging.run_id}")
    if runlog.state != "deleted":
        write_bookkeeping(
            sink.conf,
            staging.bookkeeping,
            f"{staging.run_id}/publication",
            {
                "kind": "publication",
                "state": "deleted",
                "run_id": staging.run_id,
                "topic": staging.topic,
                "topic_deleted": deleted,
                "at": now_iso(),
            },
        )
    return {
        "run_id": staging.run_id,
        "topic": staging.topic,
        "deleted": deleted,
        "already_gone": not exists,
        "kept": exists and not staging.created,
        "spool_removed": spool_removed,
    }
