"""A pydantic ValidationError turned into one line that names the field, what is wrong and what is allowed."""

from __future__ import annotations

import json
import re
import types
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ValidationError,
)
from pydantic.fields import FieldInfo

from rewind.errors import SpecError
from rewind.secrets import mask

_UNSET: Any = object()


class _Plain(str):
    """Text shown as is in a message (not quoted like a user's string)."""


class _Bad(ValueError):
    """A validation failure carrying the parts of a one-line message.

    ``at`` extends the location pydantic reports (a validator of ``source.kafka`` can point
    at ``source.kafka.to.orders.1``).
    """

    def __init__(
        self, what: str, allowed: str = "", *, got: Any = _UNSET, at: tuple[str | int, ...] = ()
    ) -> None:
        self.what = what
        self.allowed = allowed
        self.got = got
        self.at = at
        super().__init__(_compose(what, got, allowed))


def _compose(what: str, got: Any, allowed: str, key: str = "") -> str:
    text = what
    if got is not _UNSET:
        text += f" (got {_show(got, key)})"
    if allowed:
        text += f"; {allowed}"
    return text


def _show(value: Any, key: str = "", limit: int = 120) -> str:
    """A value on one line, shortened and with secrets masked: it goes into an error message."""
    value = value if isinstance(value, _Plain) else mask(value, key)
    if isinstance(value, datetime | date):
        text = value.isoformat()
    elif isinstance(value, _Plain):
        text = str(value)
    elif isinstance(value, str):
        text = f"'{value}'"
    elif value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, int | float):
        text = str(value)
    elif isinstance(value, Mapping | list | tuple):
        text = json.dumps(value, default=str, ensure_ascii=False, separators=(", ", ": "))
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _alias(name: str, info: FieldInfo) -> str:
    return info.validation_alias if isinstance(info.validation_alias, str) else (info.alias or name)


def _allowed_fields(model: type[BaseModel]) -> str:
    return ", ".join(_alias(n, f) for n, f in model.model_fields.items())


def _unwrap(annotation: Any) -> Any:
    """``X | None`` → ``X``."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _model_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model that validates the value at ``loc`` (by aliases), or None if not a model."""
    current: Any = root
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        if isinstance(current, type) and issubclass(current, BaseModel):
            found = next(
                (f for n, f in current.model_fields.items() if part in (n, _alias(n, f))),
                None,
            )
            if found is None:
                return None
            current = _unwrap(found.annotation)
        elif get_origin(current) in (dict, list):
            current = _unwrap(get_args(current)[-1])
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


_TYPE_ERRORS: dict[str, tuple[str, str]] = {
    "int_type": ("not an integer", "expected a whole number"),
    "int_parsing": ("not an integer", "expected a whole number"),
    "int_from_float": ("not a whole number", "expected a whole number"),
    "float_type": ("not a number", "expected a number"),
    "float_parsing": ("not a number", "expected a number"),
    "finite_number": ("not a finite number", "expected a number"),
    "bool_type": ("not a boolean", "expected true or false"),
    "bool_parsing": ("not a boolean", "expected true or false"),
    "string_type": ("not a string", "expected text (quote it in YAML)"),
    "list_type": ("not a list", "expected a list, like [a, b]"),
    "dict_type": ("not a mapping", "expected a mapping, like {a: b}"),
}


def _describe(root: type[BaseModel], err: Mapping[str, Any]) -> tuple[tuple[str | int, ...], str]:
    """The location and the message (without location) of one pydantic error."""
    loc: tuple[str | int, ...] = tuple(err["loc"])
    kind = err["type"]
    value = err.get("input", _UNSET)
    key = str(loc[-1]) if loc else ""
    ctx = err.get("ctx") or {}
    error = ctx.get("error")
    if isinstance(error, _Bad):
        loc = loc + error.at
        key = str(loc[-1]) if loc else ""
        return loc, _compose(error.what, error.got, error.allowed, key)
    if kind == "missing":
        return loc, "required"
    if kind == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        allowed = f"; allowed: {_allowed_fields(parent)}" if parent else ""
        return loc, f"unknown field{allowed}"
    if kind in ("model_type", "model_attributes_type"):
        model = _model_at(root, loc)
        allowed = f"expected a mapping with fields: {_allowed_fields(model)}" if model else ""
        return loc, _compose("not a mapping", value, allowed, key)
    if kind == "literal_error":
        words = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return loc, _compose("not allowed", value, f"allowed: {', '.join(words)}", key)
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        sign = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
        limit = next(iter(ctx.values()), "")
        return loc, _compose("out of range", value, f"must be {sign[kind]} {limit}", key)
    if kind in _TYPE_ERRORS:
        what, allowed = _TYPE_ERRORS[kind]
        return loc, _compose(what, value, allowed, key)
    message = str(err.get("msg", kind)).removeprefix("Value error, ")
    return loc, _compose(message[:1].lower() + message[1:], value, "", key)


def _spec_error(
    exc: ValidationError, source_name: str, root: type[BaseModel], prefix: tuple[str, ...] = ()
) -> SpecError:
    """One line for the first error (``root`` is the model validated, to find a field's model;
    ``prefix`` is where it sits in a whole spec, like ``("verify",)``)."""
    # An unknown field first: it is often a typo that also makes a required field "missing".
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    loc, text = _describe(root, errors[0])
    path = ".".join(str(p) for p in (*prefix, *loc))
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    where = f"{path}: " if path else ""
    return SpecError(" ".join(f"{source_name}: {where}{text}{more}".split()), field=path or None)
