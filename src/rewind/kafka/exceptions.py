"""Errors of operations on consumer groups: each one line, naming the group and what to do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rewind.errors import RewindError


class GroupError(RewindError):
    """Base of the consumer-group errors; ``group`` is the group's id."""

    def __init__(self, message: str, *, group: str) -> None:
        self.group = group
        super().__init__(message)


class GroupNotFound(GroupError):
    """The group has no members and no committed offsets: nothing to reset or describe."""

    def __init__(self, group: str, detail: str = "") -> None:
        suffix = f" ({detail})" if detail else ""
        super().__init__(
            f"consumer group '{group}' does not exist: it has no members and no committed offsets{suffix}; "
            "check the group id",
            group=group,
        )


class GroupActive(GroupError):
    """The group has live members (or is rebalancing): its offsets must not be changed now.

    ``members`` are ``client-id@host`` labels; empty when the broker did not list them.
    """

    def __init__(self, group: str, state: str, members: Sequence[str]) -> None:
        self.state = state
        self.members = tuple(members)
        if members:
            shown = ", ".join(members[:5]) + (f" and {len(members) - 5} more" if len(members) > 5 else "")
            who = f"{len(members)} active member{'s' if len(members) != 1 else ''}: {shown}"
        else:
            who = "no member listed by the broker"
        super().__init__(
            f"consumer group '{group}' is active (state {state}, {who}); stop its consumers and try again",
            group=group,
        )


class GroupOperationRefused(GroupError):
    """The broker (or the client) refused a group operation; ``operation`` names it."""

    def __init__(self, group: str, operation: str, detail: str, *, by: str = "the broker") -> None:
        self.operation = operation
        self.detail = detail
        super().__init__(
            f"{by} refused {operation} on consumer group '{group}': {detail}",
            group=group,
        )


class OffsetsNotApplied(GroupError):
    """Offsets written to a group did not read back as written; nothing is reported done.

    ``failures`` maps each partition to (wanted, committed now or None, broker error or "").
    """

    def __init__(
        self, group: str, failures: Mapping[tuple[str, int], tuple[int | None, int | None, str]]
    ) -> None:
        self.failures = dict(failures)
        parts = []
        for (topic, partition), (wanted, now, error) in sorted(failures.items())[:10]:
            shown_now = "none" if now is None else str(now)
            shown_wanted = "none" if wanted is None else str(wanted)
            reason = f" ({error})" if error else ""
            parts.append(f"{topic}/{partition} wanted {shown_wanted}, committed {shown_now}{reason}")
        more = f" and {len(failures) - 10} more" if len(failures) > 10 else ""
        super().__init__(
            f"offsets of consumer group '{group}' did not apply on {len(failures)} partition"
            f"{'s' if len(failures) != 1 else ''}: {'; '.join(parts)}{more}; "
            "check that the group is inactive and run `rewind groups describe` to see its offsets",
            group=group,
        )
