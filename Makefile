# The README's two commands: `make demo` (the main job) and `make test` (the tests).
# Both install what they need first: Debian packages (Java, Maven, PostgreSQL server, a C
# compiler for decoder/_fastrow.c) when missing, then pgcdc itself with pip.

PYTHON ?= python3
APT_PACKAGES := $(strip \
	$(if $(shell command -v java),,openjdk-17-jre-headless) \
	$(if $(shell command -v mvn),,maven) \
	$(if $(wildcard /usr/lib/postgresql/*/bin/initdb),,postgresql) \
	$(if $(shell command -v gcc),,gcc))

COMPOSE_APT_PACKAGES := $(strip \
	$(if $(shell command -v podman),,podman) \
	$(if $(shell command -v runc),,runc) \
	$(if $(shell command -v debootstrap),,debootstrap))

.PHONY: setup demo test lint compose-setup compose-base compose-test

setup:
ifneq ($(APT_PACKAGES),)
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(APT_PACKAGES)
endif
	$(PYTHON) -m pip install -q -e '.[test]'

demo: setup
	pgcdc demo

lint: setup
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

test: lint
	$(PYTHON) -m pytest

# docker compose up for real, with podman and images built from a local Debian base (public
# images are not pulled): tests/integration/test_compose.py, outside `make test` (minutes cold).
compose-setup: setup
ifneq ($(COMPOSE_APT_PACKAGES),)
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(COMPOSE_APT_PACKAGES)
endif
	$(PYTHON) -m pip install -q podman-compose

compose-base: compose-setup
	$(PYTHON) -m tests.fixtures.podman base

compose-test: compose-setup
	$(PYTHON) -m pytest -p no:cacheprovider -m compose -s tests/integration/test_compose.py
