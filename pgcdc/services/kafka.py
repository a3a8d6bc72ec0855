"""A throwaway single-node Kafka broker (KRaft mode) running as a local JVM process.

The broker jars come from Maven Central (``org.apache.kafka:kafka_2.13``) and are
cached outside the work tree; storage is formatted in a temporary folder.

With ``sasl_users`` the broker also listens on a ``SASL_PLAINTEXT`` port
(:attr:`KafkaBroker.sasl_bootstrap_servers`) that accepts those users and passwords with the
``PLAIN``, ``SCRAM-SHA-256`` and ``SCRAM-SHA-512`` mechanisms (SCRAM credentials are
written when the storage is formatted); the plaintext port stays open for the tests' own
clients.

With ``ssl=True`` it also listens on an ``SSL`` port (:attr:`KafkaBroker.ssl_bootstrap_servers`)
with a certificate for ``localhost`` and ``127.0.0.1`` signed by a throwaway CA
(:attr:`KafkaBroker.ssl_root_cert`, what clients put in ``ssl.ca.location``).
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from core import maven
from core.errors import TerminalError
from core.java import java_binary
from pgcdc.services.ports import free_port, wait_for_port
from pgcdc.services.process import LocalProcess

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
KAFKA_COORDINATES = [
    f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
    "org.slf4j:slf4j-simple:1.7.36",
]


class KafkaBroker(LocalProcess):
    """One KRaft node acting as broker and controller on 127.0.0.1.

    ``advertised_port``: the port the PLAINTEXT listener tells clients to connect to
    (default: the one it listens on), e.g. a TCP proxy's in front of it for fault tests.
    """

    def __init__(self, *, port: int | None = None, heap: str = "768m",
                 sasl_users: dict[str, str] | None = None,
                 advertised_port: int | None = None, ssl: bool = False) -> None:
        self.java = java_binary()
        self.sasl_users = dict(sasl_users or {})
        self.sasl_port = free_port() if self.sasl_users else None
        self.ssl_port = free_port() if ssl else None
        self.ssl_root_cert: Path | None = None  # with ssl=True: the CA that signed the broker
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self.controller_port = free_port()
        self.heap = heap
        self.base = Path(tempfile.mkdtemp(prefix="pgcdc-kafka-"))
        self.logfile = self.base / "broker.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._classpath: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap_servers(self) -> str:
        """The SASL_PLAINTEXT listener (``sasl_users`` given)."""
        if self.sasl_port is None:
            msg = "this broker has no SASL listener: start it with sasl_users={...}"
            raise TerminalError(msg)
        return f"127.0.0.1:{self.sasl_port}"

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        config = self.base / "server.properties"
        if not config.exists():
            self._format(config)
        with self.logfile.open("ab") as out:
            self._proc = subprocess.Popen(
                [self.java, f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC",
                 "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                 "-cp", self._jars(), "kafka.Kafka", str(config)],
                stdout=out, stderr=subprocess.STDOUT,
            )
        if not wait_for_port(self.port, timeout=timeout) or not self._ready(timeout):
            tail = self.log_tail()
            self.stop()
            msg = f"Kafka did not start on port {self.port} within {timeout:.0f}s:\n{tail}"
            raise TerminalError(msg)
        log.info("kafka started on %s", self.bootstrap_servers)
        return self

    def kill(self) -> None:
        """A hard crash of the broker (SIGKILL)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self._proc = None

    # --- internals ------------------------------------------------------------------------

    def _jars(self) -> str:
        if self._classpath is None:
            jars = maven.resolve("kafka", KAFKA_COORDINATES)
            self._classpath = os.pathsep.join(str(j) for j in jars)
        return self._classpath

    def _format(self, config: Path) -> None:
        data = self.base / "data"
        config.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},{self._sasl_listener()}"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners={self._sasl_listener()}"
            f"PLAINTEXT://127.0.0.1:{self.advertised_port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
            "SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL",
            *self._sasl_config(),
            *self._ssl_config(),
            f"log.dirs={data}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            # the coordinator looks for transactions open past their transaction.timeout.ms
            # every second (Kafka's default: every 10 s), so that a timed-out transaction is
            # aborted soon after its timeout (test_exactly_once waits for one)
            "transaction.abort.timed.out.transaction.cleanup.interval.ms=1000",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "",
        ]))
        cluster_id = "-"
        while cluster_id.startswith("-"):  # the tool would read a leading "-" as an option
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        result = subprocess.run(
            [self.java, "-cp", self._jars(), "kafka.tools.StorageTool", "format",
             "-t", cluster_id, "-c", str(config), *self._scram_credentials()],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            msg = f"formatting Kafka storage failed:\n{result.stdout}{result.stderr}"
            raise TerminalError(msg)

    @property
    def ssl_bootstrap_servers(self) -> str:
        """The SSL listener (``ssl=True``)."""
        if self.ssl_port is None:
            msg = "this broker has no SSL listener: start it with ssl=True"
            raise TerminalError(msg)
        return f"127.0.0.1:{self.ssl_port}"

    def _sasl_listener(self) -> str:
        """The SASL_PLAINTEXT and SSL listeners asked for, each followed by a comma."""
        sasl = f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}," if self.sasl_port else ""
        return sasl + (f"SSL://127.0.0.1:{self.ssl_port}," if self.ssl_port else "")

    def _ssl_config(self) -> list[str]:
        """A PEM keystore (the key and the certificate in one file) for the SSL listener."""
        if self.ssl_port is None:
            return []
        from pgcdc.services.postgres import make_certificates

        certs = make_certificates(self.base / "tls")
        keystore = self.base / "tls" / "broker.pem"
        keystore.write_text(certs.key.read_text() + certs.cert.read_text())
        keystore.chmod(0o600)
        self.ssl_root_cert = certs.ca
        return ["ssl.keystore.type=PEM", f"ssl.keystore.location={keystore}"]

    def _sasl_config(self) -> list[str]:
        """The SASL listener's mechanisms and their JAAS configuration (PLAIN: the users and
        passwords inline; SCRAM: the credentials stored by the format)."""
        if not self.sasl_users:
            return []
        plain = " ".join(f'user_{user}="{password}"'
                         for user, password in self.sasl_users.items())
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return [
            "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config="
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain};",
            f"listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config={scram}",
            f"listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config={scram}",
        ]

    def _scram_credentials(self) -> list[str]:
        return [arg for user, password in self.sasl_users.items()
                for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
                for arg in ("--add-scram", f"{mechanism}=[name={user},password={password}]")]

    def _ready(self, timeout: float) -> bool:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                return False
            try:
                if admin.list_topics(timeout=2).brokers:
                    return True
            except Exception:  # noqa: S110 - KafkaException while the broker boots
                pass
            time.sleep(0.3)
        return False
