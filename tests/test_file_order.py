"""The suite's file order for ``--dist loadfile``: longest recorded file first, a file's
tests together and in their own order."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from tests.file_order import longest_files_first


@dataclass(frozen=True)
class Item:
    nodeid: str


FILES = [f"tests/test_{c}.py" for c in "abcdef"]


@given(
    tests=st.lists(st.tuples(st.sampled_from(FILES), st.integers(0, 3)), max_size=40),
    seconds=st.dictionaries(st.sampled_from(FILES), st.floats(0, 500), max_size=6),
)
def test_files_come_longest_first_with_their_tests_in_order(
    tests: list[tuple[str, int]], seconds: dict[str, float]
) -> None:
    # a collection lists a file's tests together
    by_file: dict[str, list[Item]] = {}
    for n, (path, t) in enumerate(tests):
        by_file.setdefault(path, []).append(Item(f"{path}::test_{t}[{n}]"))
    items = [item for group in by_file.values() for item in group]

    ordered = list(items)
    longest_files_first(ordered, seconds)

    assert sorted(ordered, key=lambda i: i.nodeid) == sorted(items, key=lambda i: i.nodeid)
    paths = [i.nodeid.split("::")[0] for i in ordered]
    runs = [p for n, p in enumerate(paths) if n == 0 or paths[n - 1] != p]
    assert len(runs) == len(set(runs)), "a file's tests are split apart"
    for path in runs:
        assert [i for i in ordered if i.nodeid.startswith(path)] == by_file[path]
    known = [seconds[p] for p in runs if p in seconds]
    assert known == sorted(known, reverse=True)


def test_an_unrecorded_file_counts_as_a_middling_one() -> None:
    items = [Item("tests/test_new.py::t"), Item("tests/test_long.py::t"),
             Item("tests/test_short.py::t"), Item("tests/test_mid.py::t")]
    longest_files_first(items, {"tests/test_long.py": 300.0, "tests/test_mid.py": 20.0,
                                "tests/test_short.py": 1.0})
    assert [i.nodeid for i in items] == ["tests/test_long.py::t", "tests/test_new.py::t",
                                         "tests/test_mid.py::t", "tests/test_short.py::t"]
