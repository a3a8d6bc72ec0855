"""The pgoutput options pgcdc asks for, by server version (no server needed)."""

from __future__ import annotations

import pytest

from pgcdc.pipeline import OriginUnsupportedError, Pipeline, PipelineConfig
from sinks.null import NullSink


def _options(server_version: int, **config: object) -> dict[str, str]:
    pipeline = Pipeline(PipelineConfig("dbname=unused", **config), NullSink())  # type: ignore[arg-type]
    return pipeline._options(server_version)


def test_versions_and_streaming() -> None:
    assert _options(130000) == {"proto_version": "1", "publication_names": "pgcdc"}
    assert _options(150000)["streaming"] == "on"
    assert _options(160000)["streaming"] == "parallel"
    assert "streaming" not in _options(150000, streaming=False)
    assert "origin" not in _options(160000)


def test_origin_on_16_and_a_clear_error_before() -> None:
    assert _options(160000, origin="none")["origin"] == "none"
    with pytest.raises(OriginUnsupportedError, match="needs PostgreSQL 16 or later.*server is 15"):
        _options(150000, origin="none")
