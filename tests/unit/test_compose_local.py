"""docker/compose.local.yml and docker/local/: what holds without a container engine.

The override replaces every public image with one built from the local base, the Kafka image
resolves the broker's jars pgcdc.services.kafka resolves, and users keep the public images by
default. tests/integration/test_compose.py runs the stack (make compose-test).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from core import maven
from pgcdc.services.kafka import KAFKA_COORDINATES, KAFKA_VERSION
from tests.fixtures import podman

ROOT = Path(__file__).parent.parent.parent
DOCKER = ROOT / "docker"


def _yaml(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DOCKER / name).read_text())
    return loaded


def test_the_public_images_stay_the_default() -> None:
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm\nFROM ${PYTHON_IMAGE}\n" in dockerfile
    services = _yaml("compose.yml")["services"]
    assert services["postgres"]["image"] == "postgres:16"
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert "args" not in services["pgcdc"]["build"]


def test_the_override_builds_every_service_from_the_local_base() -> None:
    services = _yaml("compose.yml")["services"]
    local = _yaml("compose.local.yml")["services"]
    assert set(local) == set(services)
    for name, service in local.items():
        assert service["image"].startswith("localhost/"), name
    for name in ("postgres", "kafka"):
        build = local[name]["build"]
        assert build["args"] == {"BASE_IMAGE": podman.BASE_IMAGE}
        assert (ROOT / build["dockerfile"]).exists() and build["context"] == ".."
    for name in ("pgcdc", "spark"):
        assert local[name]["build"]["args"] == {"PYTHON_IMAGE": podman.PYTHON_IMAGE}
    assert local["pgcdc"]["image"] == local["spark"]["image"]


def test_the_kafka_image_resolves_the_brokers_jars() -> None:
    pom = (DOCKER / "local" / "kafka-pom.xml").read_text()
    found = {":".join(d) for d in re.findall(
        r"<groupId>([^<]+)</groupId><artifactId>([^<]+)</artifactId><version>([^<]+)</version>",
        pom.split("<dependencies>", 1)[1])}
    assert found == {*KAFKA_COORDINATES, f"org.apache.kafka:kafka-tools:{KAFKA_VERSION}"}
    assert maven.CENTRAL in (DOCKER / "local" / "maven-settings.xml").read_text()
    assert "apache/kafka:" + KAFKA_VERSION == _yaml("compose.yml")["services"]["kafka"]["image"]


def test_podman_runs_with_runc_and_no_default_ulimits() -> None:
    conf = tomllib.loads(podman.CONTAINERS_CONF.read_text())
    assert conf["containers"]["default_ulimits"] == []
    assert conf["engine"]["runtime"] == "runc"


def test_the_debian_mirror_is_read_from_either_sources_format(tmp_path: Path) -> None:
    deb822 = ("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
              "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
              "Suites: bookworm-security\n")
    one_line = ("deb http://security.example/debian-security bookworm-security main\n"
                "deb [arch=amd64] http://old.example/debian bookworm main\n")
    assert podman.debian_mirror([tmp_path / "missing"]) == podman.DEFAULT_MIRROR
    (tmp_path / "a.sources").write_text(deb822)
    assert podman.debian_mirror([tmp_path / "a.sources"]) == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text(one_line)
    assert podman.debian_mirror([tmp_path / "sources.list"]) == "http://old.example/debian"
