"""Reading a spec from YAML strictly (duplicate keys are an error) and validating it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from rewind.errors import SpecError
from rewind.spec.errors import _allowed_fields, _show, _spec_error
from rewind.spec.job import JobSpec
from rewind.spec.verify import Verify


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int, first: int) -> None:
        self.key, self.line, self.first = key, line, first


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in a mapping is an error."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                ident = (key_node.tag, key_node.value)
                line = key_node.start_mark.line + 1
                if ident in seen:
                    raise _DuplicateKey(key_node.value, line, seen[ident])
                seen[ident] = line
        return super().construct_mapping(node, deep=deep)


def parse_spec(data: Any, source_name: str = "<spec>") -> JobSpec:
    """Validate ``data`` (a mapping, as loaded from YAML) into a :class:`JobSpec`.

    Raises :class:`SpecError` with one line: ``<source_name>: <field.path>: <what is wrong>
    (got <value>); <what is allowed>``, plus ``(+N more)`` when other fields are wrong too.
    """
    if not isinstance(data, Mapping):
        got = "an empty file" if data is None else _show(data)
        raise SpecError(
            f"{source_name}: expected a mapping of fields at the top level (got {got}); "
            f"allowed: {_allowed_fields(JobSpec)}"
        )
    try:
        return JobSpec.model_validate(dict(data))
    except ValidationError as exc:
        raise _spec_error(exc, source_name, JobSpec) from None


def load_spec(path: str | Path) -> JobSpec:
    """Read a YAML spec file into a :class:`JobSpec`; every problem is a one-line :class:`SpecError`."""
    return parse_spec(_read_yaml(path), str(path))


def load_verify(path: str | Path) -> Verify:
    """Read a file holding only a ``verify:`` section (``rewind verify RUN --verify-file``).

    The section may stand under a ``verify:`` key (as cut from a spec) or alone; errors name
    the field as in a spec (``verify.compare.amount.abs``).
    """
    name = str(path)
    data = _read_yaml(path)
    if isinstance(data, Mapping) and "verify" in data:
        others = [str(k) for k in data if k != "verify"]
        if others:
            raise SpecError(
                f"{name}: {', '.join(others)}: a verify file holds only a verify section; "
                "give a whole spec with --spec instead"
            )
        data = data["verify"]
    if not isinstance(data, Mapping):
        got = "an empty section" if data is None else _show(data)
        raise SpecError(f"{name}: verify: expected a mapping (got {got}); allowed: {_allowed_fields(Verify)}")
    try:
        return Verify.model_validate(dict(data))
    except ValidationError as exc:
        raise _spec_error(exc, name, Verify, ("verify",)) from None


def _read_yaml(path: str | Path) -> Any:
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{name}: no such spec file; check the path") from None
    except IsADirectoryError:
        raise SpecError(f"{name}: is a directory, not a spec file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpecError(f"{name}: can't read the spec file ({' '.join(reason.split())})") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except _DuplicateKey as dup:
        raise SpecError(
            f"{name}: line {dup.line}: '{dup.key}' is given twice (first at line {dup.first}); "
            "give each field once"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise SpecError(
            f"{name}: {where}not valid YAML ({' '.join(str(problem).split())}); fix the syntax"
        ) from None
    return data
