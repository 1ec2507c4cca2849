"""The spec reference in docs/ is generated from the models: it must not drift from them."""

from __future__ import annotations

from pathlib import Path

from rewind.spec import spec_reference_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "spec-reference.md"


def test_spec_reference_is_generated_from_the_models() -> None:
    assert DOC.read_text() == spec_reference_markdown(), (
        "docs/spec-reference.md is stale: run "
        "`.venv/bin/python -c 'from rewind.spec import spec_reference_markdown as m; "
        "open(\"docs/spec-reference.md\", \"w\").write(m())'`"
    )
