"""--tables with quoted identifiers: the list split outside quotes, each name's parts read."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from decoder.names import TableNameError, format_table_name, parse_table_name, split_table_list
from pgcdc import cli
from pgcdc.config import load_settings

DSN = "host=db user=cdc dbname=app"


@pytest.mark.parametrize(("text", "names"), [
    ("public.a,public.b", ["public.a", "public.b"]),
    (" public.a , s.b ,", ["public.a", "s.b"]),
    ('public."my,table",public.b', ['public."my,table"', "public.b"]),
    ('"we""ird","x,""y"",z"', ['"we""ird"', '"x,""y"",z"']),
    ('public."Mixed Case", "s,1"."t,2"', ['public."Mixed Case"', '"s,1"."t,2"']),
    ("", []),
])
def test_a_list_is_split_at_commas_outside_quotes(text: str, names: list[str]) -> None:
    assert split_table_list(text) == names


@pytest.mark.parametrize(("name", "parts"), [
    ("orders", ("public", "orders")),
    ("public.Orders", ("public", "Orders")),  # unquoted: taken as written, case kept
    ('public."Mixed Case"', ("public", "Mixed Case")),
    ('"we""ird"', ("public", 'we"ird')),
    ('public."my,table"', ("public", "my,table")),
    ('"a.b"', ("public", "a.b")),
    ('"s.1"."t.2"', ("s.1", "t.2")),
    ('"Sch" . "t"', ("Sch", "t")),
    ('""""', ("public", '"')),
])
def test_a_name_has_quoted_or_unquoted_parts(name: str, parts: tuple[str, str]) -> None:
    assert parse_table_name(name) == parts


@pytest.mark.parametrize(("name", "reason"), [
    ('public."open', "unterminated double quote"),
    ('public."a"b', "text after a closing quote"),
    ('pub"lic.t', "double quote inside an unquoted part"),
    ("a.b.c", "more than two parts"),
    ("public.", "empty part"),
    ('public.""', "empty quoted part"),
])
def test_a_bad_name_says_what_is_wrong_and_how_to_write_it(name: str, reason: str) -> None:
    with pytest.raises(TableNameError, match=reason) as exc:
        parse_table_name(name)
    assert 'public."we""ird"' in str(exc.value)


def test_an_unterminated_quote_in_a_list_is_refused() -> None:
    with pytest.raises(TableNameError, match="unterminated double quote"):
        split_table_list('public.a,"b,c')


def _settings(*argv: str, environ: dict[str, str] | None = None,
              config_file: Path | None = None) -> list[str] | None:
    flags = vars(cli._parser().parse_args(["run", "--dsn", DSN, *argv]))
    return load_settings(flags, environ=environ or {}, config_file=config_file).source.tables


def test_the_flag_the_variable_and_the_file_take_quoted_names(tmp_path: Path) -> None:
    assert _settings("--tables", 'public."my,table",public."we""ird"') == [
        'public."my,table"', 'public."we""ird"']
    assert _settings(environ={"PGCDC_TABLES": 'public."Mixed Case",s.t'}) == [
        'public."Mixed Case"', "s.t"]
    config = tmp_path / "pgcdc.toml"
    config.write_text('[source]\ntables = [\'public."my,table"\', "public.b"]\n')
    assert _settings(config_file=config) == ['public."my,table"', "public.b"]


def test_an_unreadable_list_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'source.tables' cannot be read: table list .* "
                                          "unterminated double quote"):
        _settings("--tables", 'public."my,table')
    config = tmp_path / "pgcdc.toml"
    config.write_text("[source]\ntables = ['a.b.c']\n")
    with pytest.raises(ConfigError, match="more than two parts"):
        _settings(config_file=config)
    assert cli.main(["run", "--dsn", DSN, "--tables", 'x."y']) == 2


@pytest.mark.parametrize(("schema", "table"), [
    ("public", "orders"), ("public", 'we"ird;name'), ("Odd.Schema", "my,table"),
    ("s", ' padded '), ("public", "Robert'); DROP TABLE t;--"), ("public", '""'),
])
def test_a_formatted_name_reads_back(schema: str, table: str) -> None:
    name = format_table_name(schema, table)
    assert parse_table_name(name) == (schema, table)
    assert split_table_list(f"{name},{name}") == [name, name]
