"""docs/events.md is generated from vllm_probe.schema.events and must stay in sync."""

from pathlib import Path

from vllm_probe.schema.events import COMMON_FIELDS, KINDS, render_markdown


def test_docs_events_md_is_current():
    doc = Path(__file__).resolve().parents[2] / "docs" / "events.md"
    assert doc.read_text() == render_markdown(), "run `make docs` (python -m vllm_probe.schema.events > docs/events.md)"


def test_every_field_has_unit_and_doc():
    for kind in KINDS.values():
        names = kind.field_names
        assert len(names) == len(set(names)), kind.name
        assert not set(names) & {f.name for f in COMMON_FIELDS}, kind.name
        for f in kind.fields:
            assert f.unit and f.doc and f.type, (kind.name, f.name)
