"""Avro in the Confluent wire format, with a schema registry (``--schema-registry-url``).

Each key and value is written as Confluent's serializers write them: a magic byte 0, the
schema's id in the registry (4 bytes, big-endian), then the Avro binary of
:mod:`sinks.avro` (the same writer schemas, the same bytes).  Subjects follow the topic
(Confluent's TopicNameStrategy): ``<topic>-key`` and ``<topic>-value``.  A table version's
two schemas are registered before the first record that uses them (when the Kafka sink
publishes the version, and again, from the cache, when its first event is routed), so a
consumer always finds the id a record names.  The ``pgcdc.format`` header of such records is
``avro-confluent``; the catalog topic keeps each version's writer schemas as without a
registry, so pgcdc's own Spark job reads them the same way.

The registry is spoken to over its Confluent-compatible REST API (Apicurio Registry serves it
at ``/apis/ccompat/v7``), with HTTP basic authentication (``--schema-registry-user`` and
``--schema-registry-password``, or ``user:password@`` in the URL) and TLS (``https://``,
``--schema-registry-ca`` for a private CA).  The password never reaches a log line or an
error: messages name the URL without its user information.

What a failure does:

* the registry unreachable, timing out, or answering 5xx or 429:
  :class:`RegistryUnavailableError`, a delivery error: the pipeline retries from the durable
  position (nothing of the version is produced until its schemas have ids);
* a schema the subject's compatibility rule refuses (409) or the registry finds invalid
  (422): :class:`SchemaIncompatibleError`, terminal, naming the subject, the registry's
  message and the fix;
* any other refusal (401/403: the login; 404: no Confluent-compatible API at that URL):
  :class:`RegistryRefusedError`, terminal.

The slot never passes what was delivered: the transaction that needed the refused schema is
not complete, so its commit is never confirmed.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import struct
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from core import wire
from core.errors import ConfigError, TerminalError
from decoder.change import ChangeEvent
from sinks.acks import DeliveryError
from sinks.avro import AvroEncoder
from sinks.avro_logical import LogicalTypes
from snapshot_builder.catalog import TableVersion

log = logging.getLogger(__name__)

WIRE_FORMAT = wire.FORMAT_AVRO_CONFLUENT
"""The ``pgcdc.format`` header (and the catalog's ``value_format``) of records in the
Confluent wire format."""

MAGIC = 0
_HEADER = struct.Struct(">bI")
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
_TRANSIENT_STATUS = frozenset({408, 429})


def wire_header(schema_id: int) -> bytes:
    """The 5 bytes before the Avro binary: the magic byte and the schema id."""
    return _HEADER.pack(MAGIC, schema_id)


def key_subject(topic: str) -> str:
    return f"{topic}-key"


def value_subject(topic: str) -> str:
    return f"{topic}-value"


class RegistryUnavailableError(DeliveryError):
    """The registry did not answer, or answered that it cannot serve now (5xx, 429):
    retried from the durable position."""


class SchemaIncompatibleError(TerminalError):
    """The registry refused a schema: the subject's compatibility rule, or an invalid
    schema."""


class RegistryRefusedError(TerminalError):
    """The registry refused the request itself (the login, the URL)."""


class SchemaRegistry:
    """A client of a registry's Confluent-compatible API, for registering schemas.

    ``url``: the API's base (``http://host:8080/apis/ccompat/v7`` for Apicurio), optionally
    with ``user:password@``; ``user`` and ``password`` given apart instead; ``ca``: the CA
    file that signed an ``https`` registry's certificate (default: the system's).
    """

    def __init__(self, url: str, *, user: str | None = None, password: str | None = None,
                 ca: Path | None = None, timeout: float = 10.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            msg = (f"--schema-registry-url must be an http:// or https:// URL of the "
                   f"registry's Confluent-compatible API (got {self._redacted(parts)!r}), "
                   "e.g. http://registry:8080/apis/ccompat/v7")
            raise ConfigError(msg)
        if parts.username is not None:
            if user is not None or password is not None:
                msg = ("the schema registry's user is given twice, in --schema-registry-url "
                       "and in --schema-registry-user/--schema-registry-password: keep one")
                raise ConfigError(msg)
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
        if password is not None and user is None:
            msg = "--schema-registry-password needs --schema-registry-user"
            raise ConfigError(msg)
        if ca is not None and parts.scheme != "https":
            msg = "--schema-registry-ca goes with an https:// --schema-registry-url"
            raise ConfigError(msg)
        self.url = self._redacted(parts).rstrip("/")
        """The base URL without user information: what messages show."""
        self.user = user
        self._authorization = None if user is None else "Basic " + base64.b64encode(
            f"{user}:{password or ''}".encode()).decode("ascii")
        self.timeout = timeout
        self._context: ssl.SSLContext | None = None
        if parts.scheme == "https":
            try:
                self._context = ssl.create_default_context(
                    cafile=None if ca is None else str(ca))
            except (OSError, ssl.SSLError) as exc:
                msg = (f"--schema-registry-ca {ca} cannot be read as a CA certificate ({exc}): "
                       "give the PEM file of the CA that signed the registry's certificate")
                raise ConfigError(msg) from None

    @staticmethod
    def _redacted(parts: urllib.parse.SplitResult) -> str:
        netloc = parts.netloc.rsplit("@", 1)[-1]
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


    def __repr__(self) -> str:
        return f"SchemaRegistry({self.url!r}, user={self.user!r})"

    def check(self) -> None:
        """Ask the registry for its subjects: refused, unreachable or not a
        Confluent-compatible API, this raises what :meth:`register` would."""
        self._request("GET", "/subjects", None, what="list the subjects")

    def register(self, subject: str, schema: str) -> int:
        """The id of ``schema`` (Avro, JSON text) under ``subject``, registered if new (a new
        version of the subject, if the subject's compatibility rule allows it)."""
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        answer = self._request("POST", path, {"schema": schema}, subject=subject,
                               what=f"register a schema under the subject {subject!r}")
        schema_id = answer.get("id") if isinstance(answer, dict) else None
        if not isinstance(schema_id, int) or not 0 <= schema_id < 2**32:
            msg = (f"the schema registry at {self.url} answered a registration under "
                   f"{subject!r} without a schema id ({str(answer)[:200]}); is it a "
                   "Confluent-compatible API?")
            raise RegistryRefusedError(msg)
        return schema_id

    def _request(self, method: str, path: str, body: dict[str, Any] | None, *,
                 what: str, subject: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        # http(s) only: __init__ refused any other scheme
        request = urllib.request.Request(self.url + path, data=data,  # noqa: S310
                                         method=method)
        request.add_header("Accept", _CONTENT_TYPE)
        if data is not None:
            request.add_header("Content-Type", _CONTENT_TYPE)
        if self._authorization is not None:
            request.add_header("Authorization", self._authorization)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout,  # noqa: S310
                                        context=self._context) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise self._refusal(exc, what, subject) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):
                msg = (f"the schema registry at {self.url}: its TLS certificate is not "
                       f"trusted ({reason.verify_message}); give the CA that signed it with "
                       "--schema-registry-ca")
                raise RegistryRefusedError(msg) from None
            msg = (f"cannot reach the schema registry at {self.url} to {what}: {reason}; "
                   "check that it runs and that --schema-registry-url names it")
            raise RegistryUnavailableError(msg) from None

    def _refusal(self, exc: urllib.error.HTTPError, what: str,
                 subject: str | None) -> Exception:
        status = exc.code
        try:
            text = exc.read().decode(errors="replace")
        except OSError:
            text = ""
        finally:
            exc.close()
        try:
            message = str(json.loads(text).get("message") or text)
        except (ValueError, AttributeError):
            message = text
        message = " ".join(message.split())[:1000] or exc.reason
        where = f"the schema registry at {self.url}"
        if status >= 500 or status in _TRANSIENT_STATUS:
            return RegistryUnavailableError(
                f"{where} could not {what} (HTTP {status}): {message}; retrying")
        if status in (409, 422) and subject is not None:
            return SchemaIncompatibleError(
                f"{where} refused the new schema of subject {subject!r} (HTTP {status}): "
                f"{message}. The subject's compatibility rule does not allow this table "
                "change; pgcdc stopped before delivering any record of it (the slot stays "
                "at the last delivered transaction). Either relax the subject's rule (PUT "
                f"{self.url}/config/{subject} with {{\"compatibility\": \"NONE\"}}, or one "
                "that allows the change) and start pgcdc again, or write to a new "
                "--topic-prefix")
        if status in (401, 403):
            return RegistryRefusedError(
                f"{where} refused the login to {what} (HTTP {status}): {message}; check "
                "--schema-registry-user and --schema-registry-password "
                "(PGCDC_SCHEMA_REGISTRY_PASSWORD)")
        if status == 404:
            return RegistryRefusedError(
                f"{where} has no such resource (HTTP 404, to {what}): {message}; "
                "--schema-registry-url must name the Confluent-compatible API's base "
                "(Apicurio: http://host:8080/apis/ccompat/v7)")
        return RegistryRefusedError(f"{where} refused to {what} (HTTP {status}): {message}")


class RegistryAvroEncoder(AvroEncoder):
    """:class:`~sinks.avro.AvroEncoder` in the Confluent wire format: each key and value
    prefixed with the id of its schema in ``registry``.  :meth:`register` must have given a
    table version its ids (under its topic's subjects) before its events are encoded."""

    format = WIRE_FORMAT

    def __init__(self, registry: SchemaRegistry, *, compiled: bool | None = None,
                 logical: LogicalTypes | None = None) -> None:
        super().__init__(compiled=compiled, logical=logical)
        self.registry = registry
        self._heads: dict[tuple[int, str], tuple[bytes, bytes]] = {}
        self._subjects: dict[tuple[int, str], str] = {}  # the topic each version registered

    def register(self, table: TableVersion, topic: str) -> None:
        """Register the version's key and value schemas under ``<topic>-key`` and
        ``<topic>-value`` (once per version and topic)."""
        version = (table.oid, table.version)
        if self._subjects.get(version) == topic:
            return
        schemas = self.schemas(table)
        key_id = self.registry.register(key_subject(topic), schemas[wire.CATALOG_KEY_SCHEMA])
        value_id = self.registry.register(value_subject(topic), schemas[wire.CATALOG_VALUE_SCHEMA])
        log.info("table version %s@%s: key schema id %d, value schema id %d (subjects %s-key, "
                 "%s-value)", table.qualified_name, table.version, key_id, value_id, topic, topic)
        self._heads[version] = (wire_header(key_id), wire_header(value_id))
        self._subjects[version] = topic

    def heads(self, table: TableVersion) -> tuple[bytes, bytes]:
        heads = self._heads.get((table.oid, table.version))
        if heads is None:
            msg = (f"table version {table.qualified_name}@{table.version} has no schema ids: "
                   "its schemas were not registered before its first event")
            raise TerminalError(msg)
        return heads

    def key(self, event: ChangeEvent) -> bytes:
        return self.heads(event.table)[0] + super().key(event)
