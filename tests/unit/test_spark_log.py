"""The driver options that send Spark's log to a file (streaming/session.py, issue 16.6)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from streaming.session import LOG4J2_CONFIG, log_java_options


def test_options_name_the_shipped_config_and_the_file(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "spark.log"
    options = log_java_options(log)
    assert shlex.split(options) == [f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}",
                                    f"-Dpgcdc.spark.log={log}"]
    assert log.parent.is_dir()  # log4j would print its own error for a missing folder
    assert "${sys:pgcdc.spark.log}" in LOG4J2_CONFIG.read_text()


def test_a_path_with_spaces_and_quotes_stays_one_option(tmp_path: Path) -> None:
    """Spark splits extraJavaOptions as a shell does (quotes, no expansion)."""
    log = tmp_path / "it's a \"log\"" / "spark.log"
    assert shlex.split(log_java_options(log))[1] == f"-Dpgcdc.spark.log={log}"


def test_a_relative_path_is_made_absolute(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert shlex.split(log_java_options(Path("spark.log")))[1] == \
        f"-Dpgcdc.spark.log={tmp_path / 'spark.log'}"
