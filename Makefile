# The README's two commands: `make demo` (the main job) and `make test` (the tests).
# Both install what they need first: Debian packages (Java, Maven, PostgreSQL server, a C
# compiler for decoder/_fastrow.c) when missing, then pgcdc itself with pip.

PYTHON ?= python3
APT_PACKAGES := $(strip \
	$(if $(shell command -v java),,openjdk-17-jre-headless) \
	$(if $(shell command -v mvn),,maven) \
	$(if $(wildcard /usr/lib/postgresql/*/bin/initdb),,postgresql) \
	$(if $(shell command -v gcc),,gcc))

.PHONY: setup demo test lint

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
