"""docker/: what can be checked without a container engine (tests/integration/test_compose.py
brings the stack up for real with podman: ``make compose-test``).

The Dockerfile copies and builds everything pyproject.toml and setup.py name; the compose
file's pgcdc and Spark commands parse and their environment validates through pgcdc's own
configuration, with every variable one pgcdc reads (an unknown one would be ignored).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from pgcdc import cli
from pgcdc.config import ENV_PREFIX, KAFKA_ENV_PREFIX, KEYS, load_settings

ROOT = Path(__file__).parent.parent.parent
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "compose.yml").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _copied() -> set[str]:
    return {part for line in re.findall(r"^COPY (.+)$", DOCKERFILE, re.MULTILINE)
            for part in line.split()[:-1]}


def _extension_sources() -> list[str]:
    """The C files setup.py names."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.endswith(".c")]


def test_the_image_holds_every_package_and_builds_the_compiled_modules() -> None:
    copied = _copied()
    packages = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in packages} <= copied
    assert {"pyproject.toml", "setup.py", "README.md"} <= copied
    sources = _extension_sources()
    assert sources and all(s.split("/")[0] in copied for s in sources)
    assert re.search(r"apt-get install[^\n]*\bgcc\b", DOCKERFILE)
    script = next(iter(PYPROJECT["project"]["scripts"]))
    assert f'ENTRYPOINT ["{script}"]' in DOCKERFILE


def _service(name: str) -> dict[str, Any]:
    service: dict[str, Any] = COMPOSE["services"][name]
    return service


def test_the_pgcdc_service_configuration_validates() -> None:
    service = _service("pgcdc")
    env = {k: str(v) for k, v in service["environment"].items()}
    known = {ENV_PREFIX + k.env for k in KEYS if k.env is not None}
    assert all(v in known or v.startswith(KAFKA_ENV_PREFIX) for v in env), \
        f"variables pgcdc does not read: {sorted(set(env) - known)}"
    args = cli._parser().parse_args(service["command"])
    assert args.command == "run"
    settings = load_settings(vars(args), environ=env)
    assert "host=postgres" in settings.source.dsn.get_secret_value()
    kafka = _service("kafka")["environment"]
    advertised = kafka["KAFKA_ADVERTISED_LISTENERS"].split("//", 1)[1]
    assert env["PGCDC_BOOTSTRAP_SERVERS"] == advertised
    assert {"postgres", "kafka"} <= set(service["depends_on"])
    assert all(d["condition"] == "service_healthy" for d in service["depends_on"].values())


def test_the_spark_service_command_parses() -> None:
    service = _service("spark")
    args = cli._parser().parse_args(service["command"])
    assert args.command == "spark"
    pgcdc = _service("pgcdc")["environment"]
    assert (args.bootstrap_servers, args.topic_prefix) == (pgcdc["PGCDC_BOOTSTRAP_SERVERS"],
                                                          pgcdc["PGCDC_TOPIC_PREFIX"])
    mount = service["volumes"][0].split(":")[1]
    assert all(str(getattr(args, k)).startswith(f"file://{mount}/")
               for k in ("lake", "checkpoint"))


def test_postgres_is_configured_for_logical_decoding() -> None:
    command = " ".join(_service("postgres")["command"])
    assert "wal_level=logical" in command
