"""Jars from Maven Central, resolved with the machine's ``mvn`` and cached outside the work tree.

Kafka's broker, Spark's Kafka and Delta connectors and the PostgreSQL 16 server
build (pgcdc/services/postgres.py) all come from here, so a fresh machine needs only
Java and Maven.  Resolution goes to Maven Central
alone (a mirror of ``*``), because some Apache parent poms name extra
repositories that are not reachable everywhere.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

from core.errors import TerminalError

log = logging.getLogger(__name__)

CENTRAL = "https://repo.maven.apache.org/maven2"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>pgcdc.runtime</groupId><artifactId>{name}</artifactId><version>1</version>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""
_DEPENDENCY = (
    "    <dependency><groupId>{0}</groupId><artifactId>{1}</artifactId>"
    "<version>{2}</version></dependency>"
)
_SETTINGS = f"""<settings><mirrors><mirror><id>pgcdc-central</id><mirrorOf>*</mirrorOf>
<url>{CENTRAL}</url></mirror></mirrors></settings>
"""
_VERSION_SUFFIX = re.compile(r"-\d[\w.\-]*\.jar$")


class MavenError(TerminalError):
    """Maven is missing or could not resolve the jars."""


def cache_root() -> Path:
    """Where resolved jars live: ``$PGCDC_CACHE`` or ``~/.cache/pgcdc``."""
    return Path(os.environ.get("PGCDC_CACHE", Path.home() / ".cache" / "pgcdc"))


def artifact_id(jar: Path) -> str:
    """``kafka-clients-3.9.0.jar`` -> ``kafka-clients``."""
    return _VERSION_SUFFIX.sub("", jar.name)


def resolve(name: str, coordinates: list[str], *, exclude_from: Path | None = None) -> list[Path]:
    """Return the runtime jars of ``coordinates`` (``group:artifact:version``), resolving once.

    Jars whose artifact already ships in ``exclude_from`` (e.g. pyspark's own
    ``jars/`` folder) are left out so that one class is never on the classpath twice.
    """
    digest = hashlib.sha256("\n".join(sorted(coordinates)).encode()).hexdigest()[:12]
    target = cache_root() / "jars" / f"{name}-{digest}"
    done = target / ".complete"
    if not done.exists():
        _download(name, coordinates, target)
        done.write_text("\n".join(coordinates))
    jars = sorted(target.glob("*.jar"))
    if exclude_from is not None:
        present = {artifact_id(j) for j in exclude_from.glob("*.jar")}
        jars = [j for j in jars if artifact_id(j) not in present]
    return jars


def _download(name: str, coordinates: list[str], target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        msg = (
            "Maven ('mvn') is not on PATH; pgcdc resolves the Kafka, Spark and PostgreSQL "
            "16 jars with it: "
            "install it (apt-get install maven)"
        )
        raise MavenError(msg)
    work = target.with_name(target.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    work.mkdir(parents=True)
    deps = "\n".join(_DEPENDENCY.format(*c.split(":")) for c in coordinates)
    (work / "pom.xml").write_text(_POM.format(name=name, dependencies=deps))
    (work / "settings.xml").write_text(_SETTINGS)
    log.info("resolving %s from Maven Central (first run only)", name)
    result = subprocess.run(
        [
            mvn, "-B", "-q", "-s", "settings.xml", "dependency:copy-dependencies",
            "-DincludeScope=runtime", f"-DoutputDirectory={work / 'jars'}",
        ],
        cwd=work, capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        msg = f"Maven could not resolve {', '.join(coordinates)} from {CENTRAL}:\n{tail}"
        raise MavenError(msg)
    (work / "jars").rename(target)
    shutil.rmtree(work, ignore_errors=True)
