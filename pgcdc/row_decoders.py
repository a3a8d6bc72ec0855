"""Moved to :mod:`snapshot_builder.row_decoders` (issue 19), beside the factory of row
decoders; this name stays only until ``pgcdc/pipeline.py`` imports it from there (one
line, owned by another change), then the file goes."""

from snapshot_builder.row_decoders import RowDecoders

__all__ = ["RowDecoders"]
