"""Reset plans as CSV, in the format of kafka-consumer-groups ``--export`` / ``--from-file``.

Kafka's tool writes one line per partition, no header: ``topic,partition,offset`` for one
group, ``group,topic,partition,offset`` when several groups were asked for; ``--from-file``
reads either (it tells them apart by whether the first line parses as three fields). Rewind
writes the one-group form, sorted by topic and partition, and reads both, so a plan moves
between the two tools unchanged. A header line, which Kafka never writes, is tolerated.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping

from rewind.core.windows import TP
from rewind.groups.exceptions import ResetInputError

_HEADERS = (("topic", "partition", "offset"), ("group", "topic", "partition", "offset"))


def to_csv(offsets: Mapping[TP, int]) -> str:
    """``topic,partition,offset`` lines, as kafka-consumer-groups exports one group's plan."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for (topic, partition), offset in sorted(offsets.items()):
        writer.writerow([topic, partition, offset])
    return buf.getvalue()


def from_csv(text: str, group: str, source: str = "the plan file") -> dict[TP, int]:
    """The offsets for ``group`` in a plan exported by Kafka's tool or Rewind.

    Three fields per line are one group's plan; four carry the group first, and only the
    lines of ``group`` are taken. A partition named twice, a bad number or a plan with no
    line for the group is a one-line error naming the line.
    """
    rows = [
        (n, row)
        for n, row in enumerate(csv.reader(io.StringIO(text)), start=1)
        if any(c.strip() for c in row)
    ]
    if rows and tuple(c.strip().lower() for c in rows[0][1]) in _HEADERS:
        rows = rows[1:]
    if not rows:
        raise ResetInputError(
            f"{source} holds no offsets: expected lines topic,partition,offset", option="--from-file"
        )
    width = len(rows[0][1])
    if width not in (3, 4):
        raise ResetInputError(
            f"{source} line {rows[0][0]}: {len(rows[0][1])} fields; expected topic,partition,offset "
            "or group,topic,partition,offset",
            option="--from-file",
        )
    out: dict[TP, int] = {}
    groups: set[str] = set()
    for n, row in rows:
        fields = [c.strip() for c in row]
        if len(fields) != width:
            raise ResetInputError(
                f"{source} line {n}: {len(fields)} fields where line {rows[0][0]} has {width}",
                option="--from-file",
            )
        if width == 4:
            line_group, fields = fields[0], fields[1:]
            groups.add(line_group)
            if line_group != group:
                continue
        topic, partition_text, offset_text = fields
        try:
            partition, offset = int(partition_text), int(offset_text)
        except ValueError:
            raise ResetInputError(
                f"{source} line {n}: partition {partition_text!r} and offset {offset_text!r} "
                "must be whole numbers",
                option="--from-file",
            ) from None
        if not topic or partition < 0 or offset < 0:
            raise ResetInputError(
                f"{source} line {n}: expected a topic, a partition >= 0 and an offset >= 0, "
                f"got {','.join(row)}",
                option="--from-file",
            )
        if (topic, partition) in out:
            raise ResetInputError(
                f"{source} line {n}: {topic}/{partition} is named twice", option="--from-file"
            )
        out[(topic, partition)] = offset
    if not out:
        shown = ", ".join(sorted(groups)[:5])
        raise ResetInputError(
            f"{source} has no lines for group '{group}' (it names {shown})", option="--from-file"
        )
    return out
