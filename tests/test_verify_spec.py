"""The spec's `verify` section: shapes, defaults, one-line errors, and the rules resolved from it."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from rewind.errors import SpecError
from rewind.spec import EXAMPLE_SPEC, Reference, Tolerance, Verify, parse_spec
from rewind.verify.exceptions import VerifyError
from rewind.verify.rules import resolve

ISSUE_EXAMPLE = """
reference: {target: true}
scope: {time_column: _rewind_source_timestamp, filter: "status != 'test'"}
key: [order_id]
compare:
  total: {abs: 0.01}
  status: exact
  updated_at: {timestamp_precision: s}
nulls_equal: true
buckets: {time_column: last_event_at, granularity: day, category: status}
assertions:
  - {name: no negative totals, sql: "SELECT count(*) FROM staging WHERE total < 0", expect: 0}
  - name: daily sums
    sql: "SELECT day, sum(total) FROM staging GROUP BY day"
    compare_to_reference: true
    rel: 0.0001
"""


def spec_with(verify: Any) -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE_SPEC)
    data["verify"] = verify
    return data


def error_of(verify: Any) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_spec(spec_with(verify), "spec.yaml")
    return caught.value


def test_the_issue_example_parses_and_round_trips() -> None:
    spec = parse_spec(spec_with(yaml.safe_load(ISSUE_EXAMPLE)))
    v = spec.verify
    assert v is not None
    assert v.reference.kind == "target" and v.mode == "repair"
    assert v.scope.time_column == "_rewind_source_timestamp"
    assert v.compare == {
        "total": Tolerance(abs=0.01),
        "status": Tolerance(),
        "updated_at": Tolerance(timestamp_precision="s"),
    }
    assert v.compare["status"].exact and not v.compare["total"].exact
    assert v.buckets.category == "status" and v.buckets.granularity == "day"
    assert [a.name for a in v.assertions] == ["no negative totals", "daily sums"]
    assert v.assertions[0].expect == 0 and v.assertions[1].compare_to_reference
    again = parse_spec(yaml.safe_load(spec.to_yaml()))
    assert again == spec and again.fingerprint() == spec.fingerprint()


def test_no_verify_section_stays_valid_and_defaults_to_the_target() -> None:
    assert parse_spec(yaml.safe_load(EXAMPLE_SPEC)).verify is None
    assert parse_spec(spec_with(None)).verify is None
    v = parse_spec(spec_with({})).verify
    assert v == Verify() and v.reference == Reference(target=True) and v.mode == "repair"


@pytest.mark.parametrize(
    ("reference", "kind", "mode"),
    [
        ({"iceberg": "lake.truth"}, "iceberg", "match"),
        ({"postgres": {"url": "postgresql://u@h/db", "table": "public.orders"}}, "postgres", "match"),
        ({"sql": "SELECT * FROM lines"}, "sql", "match"),
        ({"sql": {"query": "SELECT 1", "views": {"lines": "lake.lines"}}}, "sql", "match"),
    ],
)
def test_reference_kinds(reference: dict[str, Any], kind: str, mode: str) -> None:
    v = parse_spec(spec_with({"reference": reference})).verify
    assert v is not None and v.reference.kind == kind and v.mode == mode


def test_compare_as_a_list_and_scope_times() -> None:
    v = parse_spec(
        spec_with(
            {"compare": ["a", "b"], "scope": {"from": "2026-10-01T02:00:00+02:00", "to": 1791417600000}}
        )
    ).verify
    assert v is not None and v.compare == {"a": Tolerance(), "b": Tolerance()}
    assert v.scope.from_ == datetime(2026, 10, 1, tzinfo=UTC)
    assert v.scope.to == datetime(2026, 10, 8, tzinfo=UTC)


def test_secrets_do_not_leak_from_the_reference_url() -> None:
    spec = parse_spec(
        spec_with({"reference": {"postgres": {"url": "postgresql://u:hunter2@h/db", "table": "t"}}})
    )
    assert "hunter2" not in repr(spec) and "hunter2" not in str(spec.public())


@pytest.mark.parametrize(
    ("verify", "field", "texts"),
    [
        (3, "verify", ("not a mapping", "(got 3)")),
        ({"a": 1}, "verify.a", ("unknown field", "reference, mode, scope")),
        ({"reference": {}}, "verify.reference", ("no reference given", "target, iceberg, postgres, sql")),
        ({"reference": {"target": True, "iceberg": "a.b"}}, "verify.reference", ("more than one",)),
        ({"reference": {"target": False}}, "verify.reference.target", ("not true",)),
        ({"reference": {"iceberg": "truth"}}, "verify.reference.iceberg", ("namespace.table",)),
        (
            {"reference": {"postgres": {"url": "mysql://h/db", "table": "t"}}},
            "verify.reference.postgres.url",
            ("PostgreSQL URL",),
        ),
        (
            {"reference": {"postgres": {"table": "t", "query": "select 1"}}},
            "verify.reference.postgres",
            ("more than one",),
        ),
        (
            {"reference": {"sql": {"query": "x", "views": {"staging": "a.b"}}}},
            "verify.reference.sql.views.staging",
            ("not a free view name",),
        ),
        ({"compare": {"total": "fuzzy"}}, "verify.compare.total", ("not a tolerance", "{abs: 0.01}")),
        ({"compare": {"total": {"abs": -1}}}, "verify.compare.total.abs", ("must be >= 0",)),
        (
            {"compare": {"t": {"rel": 0.1, "timestamp_precision": "s"}}},
            "verify.compare.t",
            ("numeric and timestamp",),
        ),
        (
            {"compare": {"t": {"timestamp_precision": "fortnight"}}},
            "verify.compare.t.timestamp_precision",
            ("allowed: us, ms, s, min, h, d",),
        ),
        ({"compare": {}}, "verify.compare", ("empty",)),
        ({"key": ["id"], "compare": {"id": "exact"}}, "verify.compare.id", ("a key column is compared",)),
        (
            {"scope": {"from": "2026-10-01T00:00:00"}},
            "verify.scope.from",
            ("not a time", "2026-10-01T00:00:00Z"),
        ),
        (
            {"scope": {"from": "2026-10-02T00:00:00Z", "to": "2026-10-01T00:00:00Z"}},
            "verify.scope.to",
            ("not after from",),
        ),
        ({"buckets": {"granularity": "week"}}, "verify.buckets.granularity", ("allowed: hour, day",)),
        (
            {"assertions": [{"name": "a", "sql": "x"}, {"name": "a", "sql": "y"}]},
            "verify.assertions.1.name",
            ("used twice",),
        ),
        (
            {"assertions": [{"name": "a", "sql": "x", "expect": 1, "compare_to_reference": True}]},
            "verify.assertions.0.expect",
            ("not both",),
        ),
        ({"samples": -1}, "verify.samples", ("must be >= 0",)),
        ({"mode": "fix"}, "verify.mode", ("allowed: match, repair",)),
    ],
)
def test_every_error_is_one_line_naming_the_field(verify: Any, field: str, texts: tuple[str, ...]) -> None:
    error = error_of(verify)
    text = str(error)
    assert "\n" not in text and text.startswith(f"spec.yaml: {field}: "), text
    for part in texts:
        assert part in text, text


# -- rules resolved against the two sides ------------------------------------------------------

STAGING = {
    "order_id": "bigint",
    "total": "double",
    "status": "string",
    "updated_at": "timestamp",
    "_rewind_source_timestamp": "timestamp",
    "_rewind_run_id": "string",
}


def test_defaults_compare_common_columns_exactly_and_take_the_job_key() -> None:
    reference = {k: v for k, v in STAGING.items() if k != "_rewind_run_id"} | {"legacy": "string"}
    rules = resolve(
        Verify.model_validate({"reference": {"iceberg": "a.b"}}), STAGING, reference, job_key=["order_id"]
    )
    assert rules.key == ("order_id",)
    assert [c.name for c in rules.columns] == ["total", "status", "updated_at"]
    assert all(c.kind == "exact" for c in rules.columns)
    assert any("legacy" in note for note in rules.notes)
    assert rules.time_column is None and rules.mode == "match"


def test_repair_mode_takes_the_lineage_time_and_the_job_window() -> None:
    window = (datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 10, 8, tzinfo=UTC))
    rules = resolve(Verify(), STAGING, STAGING, job_key=["order_id"], job_window=window)
    assert rules.mode == "repair" and rules.time_column == "_rewind_source_timestamp"
    assert rules.window == window and rules.bucket_column == "_rewind_source_timestamp"
    unbounded = resolve(Verify(), STAGING, STAGING, job_key=["order_id"])
    assert unbounded.window == (None, None) and any("unbounded" in n for n in unbounded.notes)
    no_key = resolve(
        Verify(), STAGING | {"_rewind_event_id": "string"}, STAGING | {"_rewind_event_id": "string"}
    )
    assert no_key.key == ("_rewind_event_id",)


@pytest.mark.parametrize(
    ("verify", "text"),
    [
        ({"key": ["nope"]}, "verify.key: column 'nope' is not in staging"),
        (
            {"compare": {"status": {"abs": 1}}},
            "verify.compare.status: column 'status' is string; abs and rel apply to numbers only",
        ),
        ({"compare": {"total": {"timestamp_precision": "s"}}}, "is double, not a timestamp or date"),
        ({"buckets": {"category": "region"}}, "verify.buckets.category: column 'region' is not in staging"),
        ({"scope": {"time_column": "status"}}, "verify.scope.time_column: column 'status' is string"),
    ],
)
def test_rules_name_the_column_and_the_side(verify: dict[str, Any], text: str) -> None:
    with pytest.raises(VerifyError, match=re.escape(text)) as caught:
        resolve(
            Verify.model_validate({"reference": {"iceberg": "a.b"}, **verify}),
            STAGING,
            STAGING,
            job_key=["order_id"],
        )
    assert "\n" not in str(caught.value)


def test_a_column_missing_from_the_reference_is_named_with_its_side() -> None:
    reference = {k: v for k, v in STAGING.items() if k != "total"}
    verify = Verify.model_validate({"reference": {"iceberg": "a.b"}, "compare": {"total": {"abs": 0.1}}})
    with pytest.raises(VerifyError, match=r"column 'total' is not in iceberg:a\.b"):
        resolve(verify, STAGING, reference, job_key=["order_id"], reference_name="iceberg:a.b")
