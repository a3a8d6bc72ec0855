"""The registry client's pure parts (URLs, credentials, what each answer means) and the
Confluent wire format of sinks/registry.py; the registry itself in
tests/integration/test_schema_registry.py."""

from __future__ import annotations

import base64
import io
import json
import struct
import urllib.error
from email.message import Message
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from core.errors import ConfigError, TerminalError
from decoder.change import ChangeEvent
from pgcdc.config import load_settings
from pgcdc.services.ports import free_port
from sinks.acks import DeliveryError
from sinks.avro import COMPILED_ENCODER, AvroEncoder
from sinks.registry import (
    RegistryAvroEncoder,
    RegistryRefusedError,
    RegistryUnavailableError,
    SchemaIncompatibleError,
    SchemaRegistry,
    wire_header,
)
from snapshot_builder.catalog import Column, TableVersion

SECRET = "s3cr3t-pa55"
TABLE = TableVersion(42, "public", "orders", "v1", (
    Column("id", 23, "int4", -1, True),
    Column("note", 25, "text", -1, False),
    Column("amount", 1700, "numeric", -1, False),
))


def test_user_and_password_in_the_url_become_basic_auth_and_leave_the_url() -> None:
    registry = SchemaRegistry(f"https://cdc:{SECRET}@registry.example:8443/apis/ccompat/v7/")
    assert registry.url == "https://registry.example:8443/apis/ccompat/v7"
    assert registry.user == "cdc"
    assert registry._authorization == "Basic " + base64.b64encode(  # noqa: SLF001
        f"cdc:{SECRET}".encode()).decode()
    assert SECRET not in repr(registry)


def test_user_and_password_given_apart() -> None:
    registry = SchemaRegistry("http://r:8080/apis/ccompat/v7", user="u", password="p")
    assert registry._authorization == "Basic " + base64.b64encode(b"u:p").decode()  # noqa: SLF001
    assert SchemaRegistry("http://r:8080")._authorization is None  # noqa: SLF001


@pytest.mark.parametrize(("url", "options", "said"), [
    (f"ftp://u:{SECRET}@r/x", {}, "http:// or https://"),
    ("registry:8080", {}, "http:// or https://"),
    (f"http://u:{SECRET}@r:8080", {"user": "v"}, "given twice"),
    ("http://r:8080", {"password": SECRET}, "needs --schema-registry-user"),
    ("http://r:8080", {"ca": Path("/ca.pem")}, "https://"),
])
def test_bad_settings_are_configuration_errors_without_the_password(
        url: str, options: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError, match=said) as caught:
        SchemaRegistry(url, **options)
    assert SECRET not in str(caught.value)


def _refusal(status: int, body: object) -> Exception:
    registry = SchemaRegistry(f"http://u:{SECRET}@r:8080/apis/ccompat/v7")
    error = urllib.error.HTTPError("http://r:8080/x", status, "reason", Message(),
                                   io.BytesIO(json.dumps(body).encode()))
    return registry._refusal(error, "register a schema", "app.public.orders-value")  # noqa: SLF001


def test_an_incompatible_schema_is_terminal_and_names_the_subject_message_and_fix() -> None:
    error = _refusal(409, {"message": "Incompatible artifact: reader type: STRING not "
                                      "compatible with writer type: INT", "error_code": 0})
    assert isinstance(error, SchemaIncompatibleError)
    assert isinstance(error, TerminalError)
    text = str(error)
    assert "'app.public.orders-value'" in text
    assert "reader type: STRING not compatible with writer type: INT" in text
    assert "HTTP 409" in text and "compatibility" in text and "--topic-prefix" in text
    assert "/config/app.public.orders-value" in text
    assert SECRET not in text
    assert isinstance(_refusal(422, {"message": "invalid schema"}), SchemaIncompatibleError)


@pytest.mark.parametrize("status", [500, 502, 503, 429, 408])
def test_a_registry_that_cannot_serve_now_is_retried(status: int) -> None:
    error = _refusal(status, {"message": "storage unavailable"})
    assert isinstance(error, RegistryUnavailableError)
    assert isinstance(error, DeliveryError)  # what the pipeline's retry loop retries
    assert "storage unavailable" in str(error)


def test_a_refused_login_or_a_wrong_url_is_terminal_with_the_fix() -> None:
    login = _refusal(401, {"message": "Unauthorized"})
    assert isinstance(login, RegistryRefusedError)
    assert "--schema-registry-user" in str(login)
    missing = _refusal(404, {"message": "Could not find resource"})
    assert isinstance(missing, RegistryRefusedError)
    assert "/apis/ccompat/v7" in str(missing)
    assert not isinstance(missing, DeliveryError)


def test_an_unreachable_registry_is_retried_and_named_without_the_password() -> None:
    registry = SchemaRegistry(f"http://u:{SECRET}@127.0.0.1:{free_port()}/apis/ccompat/v7",
                              timeout=2)
    with pytest.raises(RegistryUnavailableError) as caught:
        registry.register("t-value", '"string"')
    assert "cannot reach the schema registry at http://127.0.0.1:" in str(caught.value)
    assert SECRET not in str(caught.value)


class _Ids:
    """Hands out ids as a registry would: one per distinct (subject, schema)."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, str], int] = {}

    def register(self, subject: str, schema: str) -> int:
        return self.ids.setdefault((subject, schema), 1000 + len(self.ids))


def _event(op: str = "c") -> ChangeEvent:
    row: Any = {"id": 7, "note": "hello", "amount": "12.50"}
    if op == "t":  # a truncate: no row, the key is the null key
        row = None
    elif op == "u":  # a row the compiled encoder leaves to the Python one (not a dict)
        row = MappingProxyType(row)
    return ChangeEvent(op, TABLE, None, row, (), 0x100, 0x120, 3, 99, 785_000_000_123_456)


@pytest.mark.parametrize("compiled", [False, True] if COMPILED_ENCODER else [False])
def test_records_are_the_avro_bytes_behind_the_magic_byte_and_schema_id(compiled: bool) -> None:
    ids = _Ids()
    encoder = RegistryAvroEncoder(ids, compiled=compiled)  # type: ignore[arg-type]
    with pytest.raises(TerminalError, match="not registered"):
        encoder.encode(_event(), server_name="app", now_ms=5)
    encoder.register(TABLE, "app.public.orders")
    key_id = ids.ids[("app.public.orders-key", encoder.schemas(TABLE)["key_schema"])]
    value_id = ids.ids[("app.public.orders-value", encoder.schemas(TABLE)["value_schema"])]
    assert wire_header(value_id) == b"\x00" + struct.pack(">I", value_id)
    plain = AvroEncoder(compiled=compiled)
    for op in ("c", "r", "d", "t", "u"):
        key, value = encoder.encode(_event(op), server_name="app", now_ms=5)
        plain_key, plain_value = plain.encode(_event(op), server_name="app", now_ms=5)
        assert key == wire_header(key_id) + plain_key
        assert value == wire_header(value_id) + plain_value
        assert encoder.key(_event(op)) == key
    assert encoder.format == "avro-confluent"


def test_the_initial_loads_compiled_path_writes_the_same_framed_bytes() -> None:
    loadfast = pytest.importorskip("sinks.loadfast")
    if loadfast._loadfast is None or loadfast.librdkafka_path() is None:  # noqa: SLF001
        # an optional compiled path (setup.py builds it only where a C compiler and
        # librdkafka are found); the Python path's framing is tested above regardless
        pytest.skip("sinks._loadfast is not built (no C compiler) or no librdkafka")
    from decoder.change import READ, RowDecoder
    from decoder.type_registry import TypeRegistry
    from loads.chunk_reader import row_builder

    producer = loadfast._loadfast.Producer(  # noqa: SLF001
        loadfast.librdkafka_path(), [("bootstrap.servers", "127.0.0.1:9"), ("log_level", "0")])
    try:
        encoder = RegistryAvroEncoder(_Ids())  # type: ignore[arg-type]
        encoder.register(TABLE, "app.public.orders")
        decoder = RowDecoder(TABLE, TypeRegistry().decoder_for)
        plan = loadfast.compile_table(producer, TABLE, decoder, encoder, "app", "t",
                                      [("pgcdc.table_version", b"v1")], 0x100, 785_000_000_123_456)
        fields = ["7", "tab\there", "12.50"]
        fast = plan.encode(b"7\ttab\\there\t12.50\n", 4, 5)
        event = ChangeEvent(READ, TABLE, None, row_builder(decoder)(fields), (), 0x100, 0x100,
                            4, 0, 785_000_000_123_456)
        assert fast == encoder.encode(event, server_name="app", now_ms=5)
        assert fast[0][:1] == b"\x00" and fast[1][:1] == b"\x00"
    finally:
        producer.close()


def test_settings_refuse_a_registry_without_avro_and_keep_the_password_secret() -> None:
    base = {"dsn": "host=db", "schema_registry_url": f"http://u:{SECRET}@r:8080/apis/ccompat/v7"}
    with pytest.raises(ConfigError, match="format avro") as caught:
        load_settings({**base, "format": "json"}, environ={})
    assert SECRET not in str(caught.value)
    with pytest.raises(ConfigError, match="schema_registry_url"):
        load_settings({"dsn": "host=db", "schema_registry_user": "u"}, environ={})
    settings = load_settings({"dsn": "host=db", "bootstrap_servers": "k:9092"}, environ={
        "PGCDC_SCHEMA_REGISTRY_URL": "https://r:8443/apis/ccompat/v7",
        "PGCDC_SCHEMA_REGISTRY_USER": "cdc", "PGCDC_SCHEMA_REGISTRY_PASSWORD": SECRET})
    registry = settings.sink.schema_registry()
    assert registry is not None and registry.url == "https://r:8443/apis/ccompat/v7"
    assert SECRET not in repr(settings) and SECRET not in repr(registry)
    assert load_settings({"dsn": "host=db"}, environ={}).sink.schema_registry() is None


def test_the_password_may_come_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "registry-password"
    secret.write_text(SECRET + "\n")
    settings = load_settings({"dsn": "host=db", "schema_registry_url": "http://r:8080",
                              "schema_registry_user": "cdc"},
                             environ={"PGCDC_SCHEMA_REGISTRY_PASSWORD_FILE": str(secret)})
    registry = settings.sink.schema_registry()
    assert registry is not None
    assert registry._authorization == "Basic " + base64.b64encode(  # noqa: SLF001
        f"cdc:{SECRET}".encode()).decode()
