"""Exports of a run (``vllm-probe export --format NAME``, the metrics server) and the
registry of export formats: :func:`exporters`, by ``--format`` name. What a format is:
:mod:`.base`."""

from __future__ import annotations

from .base import Exporter

#: The formats, by ``--format`` name (filled by :func:`exporters`).
EXPORTERS: dict[str, Exporter] = {}


def exporters() -> dict[str, Exporter]:
    """The registry of formats, by name (loaded on first use: importing a format's
    module is left to the commands that export)."""
    if not EXPORTERS:
        from .jsonl import JsonlExporter
        from .parquet import ParquetExporter
        from .perfetto import PerfettoExporter
        from .trace import TraceExporter

        for exporter in (JsonlExporter(), PerfettoExporter(), TraceExporter(), ParquetExporter()):
            EXPORTERS[exporter.name] = exporter
    return EXPORTERS
