"""A throwaway schema registry: Apicurio Registry 2.4.2.Final as a local JVM process.

Apicurio's Confluent-compatible API (``/apis/ccompat/v7``) is what ``pgcdc run
--schema-registry-url`` and Confluent's own clients talk to.  The registry is built once from
Maven Central with the machine's ``mvn`` (the wrapper pom ``apicurio/pom.xml`` beside this
file: Apicurio's BOM, ``apicurio-registry-app`` indexed by Quarkus's ``build`` goal, the JSON
Schema library from Central instead of JitPack) and cached beside the other resolved jars
(``$PGCDC_CACHE`` or ``~/.cache/pgcdc``, ``apicurio/registry-<digest of the pom>``); the first
build takes about 2 minutes with an empty ``~/.m2`` (210 MB from Maven Central), a start
about 4 s and 200 MB of memory.  Storage is in memory (H2): a registry stopped with
:meth:`SchemaRegistryServer.stop` forgets its schemas; :meth:`~SchemaRegistryServer.pause`
freezes it instead (requests hang, nothing is lost).

With ``tls=True`` it also serves HTTPS (:attr:`SchemaRegistryServer.tls_url`) with a
certificate for ``localhost`` and ``127.0.0.1`` signed by a throwaway CA
(:attr:`SchemaRegistryServer.ca`).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from core import maven
from core.errors import TerminalError
from core.java import java_binary
from pgcdc.services.ports import free_port, wait_for_port
from pgcdc.services.process import LocalProcess

log = logging.getLogger(__name__)

APICURIO_VERSION = "2.4.2.Final"
POM = Path(__file__).with_name("apicurio") / "pom.xml"
CCOMPAT_PATH = "/apis/ccompat/v7"
# Maven Central alone, as pgcdc/services/maven.py resolves
_SETTINGS = f"""<settings><mirrors><mirror><id>pgcdc-central</id><mirrorOf>*</mirrorOf>
<url>{maven.CENTRAL}</url></mirror></mirrors></settings>
"""


def build() -> Path:
    """The registry's runner jar (its ``lib/`` beside it), built on first use."""
    pom = POM.read_bytes()
    target = maven.cache_root() / "apicurio" / f"registry-{hashlib.sha256(pom).hexdigest()[:12]}"
    done = target / ".complete"
    if not done.exists():
        _build(pom, target)
        done.write_text(APICURIO_VERSION)
    jars = sorted(target.glob("*-runner.jar"))
    if not jars:
        msg = f"the registry build in {target} holds no runner jar: remove the folder to rebuild"
        raise maven.MavenError(msg)
    return jars[0]


def _build(pom: bytes, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        msg = ("Maven ('mvn') is not on PATH; pgcdc builds the Apicurio schema registry with "
               "it: install it (apt-get install maven)")
        raise maven.MavenError(msg)
    work = target.with_name(target.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "pom.xml").write_bytes(pom)
    (work / "settings.xml").write_text(_SETTINGS)
    log.info("building Apicurio Registry %s from Maven Central (first run only, minutes)",
             APICURIO_VERSION)
    result = subprocess.run(
        [mvn, "-B", "-q", "-s", "settings.xml", "package", "-DskipTests"],
        cwd=work, capture_output=True, text=True, check=False,
    )
    runners = sorted((work / "target").glob("*-runner.jar"))
    if result.returncode != 0 or not runners:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        msg = (f"Maven could not build Apicurio Registry {APICURIO_VERSION} from "
               f"{maven.CENTRAL}:\n{tail}")
        raise maven.MavenError(msg)
    built = work / "built"
    built.mkdir()
    runners[0].rename(built / runners[0].name)
    (work / "target" / "lib").rename(built / "lib")
    built.rename(target)
    shutil.rmtree(work, ignore_errors=True)


class SchemaRegistryServer(LocalProcess):
    """One Apicurio Registry on 127.0.0.1, in-memory storage, no authentication."""

    def __init__(self, *, port: int | None = None, heap: str = "256m", tls: bool = False) -> None:
        self.java = java_binary()
        self.port = port or free_port()
        self.tls_port = free_port() if tls else None
        self.ca: Path | None = None  # with tls=True: the CA that signed the certificate
        self.heap = heap
        self.base = Path(tempfile.mkdtemp(prefix="pgcdc-registry-"))
        self.logfile = self.base / "registry.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (what ``--schema-registry-url`` takes)."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    @property
    def tls_url(self) -> str:
        if self.tls_port is None:
            msg = "this registry serves no HTTPS: start it with tls=True"
            raise TerminalError(msg)
        return f"https://localhost:{self.tls_port}{CCOMPAT_PATH}"

    def start(self, timeout: float = 180.0) -> SchemaRegistryServer:
        jar = build()
        with self.logfile.open("ab") as out:
            self._proc = subprocess.Popen(
                [self.java, f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={self.port}",
                 *self._tls_options(), "-jar", str(jar)],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.base,
            )
        if not wait_for_port(self.port, timeout=timeout) or not self._ready(timeout):
            tail = self.log_tail()
            self.stop()
            msg = (f"Apicurio Registry did not start on port {self.port} within "
                   f"{timeout:.0f}s:\n{tail}")
            raise TerminalError(msg)
        log.info("schema registry started at %s", self.url)
        return self

    def _tls_options(self) -> list[str]:
        if self.tls_port is None:
            return []
        from pgcdc.services.postgres import make_certificates

        certs = make_certificates(self.base / "tls")
        self.ca = certs.ca
        return [f"-Dquarkus.http.ssl-port={self.tls_port}",
                f"-Dquarkus.http.ssl.certificate.files={certs.cert}",
                f"-Dquarkus.http.ssl.certificate.key-files={certs.key}"]

    def _ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            try:
                request = f"{self.url}/subjects"  # our own http:// URL
                with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
                    if answer.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        return False
