"""One grammar of Spark types: what the spec accepts, the plan can turn into Arrow."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rewind.core.datatypes import SparkTypeError, arrow_type, parse_spark_type
from rewind.errors import ConfigError, SpecError
from rewind.spec import parse_spec
from rewind.translate.factory import declared_output_schema
from tests import job_fixtures as jf

SIMPLE = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "smallint": pa.int16(),
    "tinyint": pa.int8(),
    "double": pa.float64(),
    "real": pa.float32(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "binary": pa.binary(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}


def spark_types() -> st.SearchStrategy[tuple[str, pa.DataType]]:
    """Spark type texts, nested to any depth, each with the Arrow type it must become."""
    leaf = st.one_of(
        st.sampled_from(sorted(SIMPLE.items())),
        st.integers(1, 38).flatmap(
            lambda p: st.integers(0, p).map(lambda s: (f"decimal({p}, {s})", pa.decimal128(p, s)))
        ),
        st.integers(1, 200).map(lambda n: (f"VARCHAR({n})", pa.string())),
        st.integers(1, 9).map(lambda n: (f"char({n})", pa.string())),
    )

    Case = tuple[str, pa.DataType]

    def nest(inner: st.SearchStrategy[Case]) -> st.SearchStrategy[Case]:
        array = inner.map(lambda t: (f"array<{t[0]}>", pa.list_(t[1])))
        mapping = st.tuples(st.sampled_from(["string", "long"]), inner).map(
            lambda kv: (f"map<{kv[0]}, {kv[1][0]}>", pa.map_(SIMPLE[kv[0]], kv[1][1]))
        )
        name = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
        names = st.lists(name, min_size=1, max_size=3, unique=True)
        struct = names.flatmap(
            lambda ns: st.tuples(*[inner for _ in ns]).map(
                lambda ts: (
                    "struct<" + ", ".join(f"{n}: {t[0]}" for n, t in zip(ns, ts, strict=True)) + ">",
                    pa.struct([pa.field(n, t[1]) for n, t in zip(ns, ts, strict=True)]),
                )
            )
        )
        return st.one_of(array, mapping, struct)

    return st.recursive(leaf, nest, max_leaves=6)


def spec_with_output(kind: str) -> Any:
    data = jf.order_spec("types", "t", "shop.types")
    data["translate"]["output_schema"] = {**data["translate"]["output_schema"], "x": kind}
    return parse_spec(data)


@given(spark_types())
def test_every_type_the_spec_accepts_becomes_the_right_arrow_type(case: tuple[str, pa.DataType]) -> None:
    text, expected = case
    spec = spec_with_output(text)  # the spec's validation accepts it...
    canonical = spec.translate.output_schema["x"]
    assert arrow_type(text) == expected  # ...and the plan's Arrow mapping agrees
    assert arrow_type(canonical) == expected and parse_spark_type(canonical).ddl() == canonical


@given(st.text(max_size=30))
def test_the_spec_and_the_plan_refuse_the_same_texts(text: str) -> None:
    try:
        parse_spark_type(text)
    except SparkTypeError:
        with pytest.raises(SpecError):
            spec_with_output(text)
        with pytest.raises(ConfigError):
            arrow_type(text)
    else:
        # the plan maps the text as typed and as the spec stores it (canonical) alike
        assert arrow_type(text) == arrow_type(parse_spark_type(text).ddl())
        assert spec_with_output(text).translate.output_schema["x"] == parse_spark_type(text).ddl()


def test_the_types_the_plan_used_to_refuse_now_plan() -> None:
    """Issue #19.4: `array<string>`, `timestamp_ntz`, `varchar(10)` passed the spec, then failed."""
    data = jf.order_spec("types", "t", "shop.types")
    added = {"tags": "array<string>", "at": "timestamp_ntz", "code": "varchar(10)"}
    data["translate"]["output_schema"] = {**data["translate"]["output_schema"], **added}
    schema = declared_output_schema(parse_spec(data).translate)
    assert schema is not None
    got = {name: schema.field(name).type for name in added}
    assert got == {"tags": pa.list_(pa.string()), "at": pa.timestamp("us"), "code": pa.string()}


@pytest.mark.parametrize(
    "text", ["decimal(39,2)", "decimal(5,6)", "array<>", "map<string>", "struct<a int>x", "varchar"]
)
def test_bad_types_name_what_is_wrong(text: str) -> None:
    with pytest.raises(SpecError, match=r"translate\.output_schema"):
        spec_with_output(text)
    with pytest.raises(ConfigError, match="type"):
        arrow_type(text)
