"""Build of the compiled modules, decoder._fastrow and sinks._fastavro (everything else is in
pyproject.toml).

pgcdc works without them (decoder/tuples.py and sinks/avro.py fall back to the same loops in
Python), so a machine without a C compiler still installs; `make setup` and CI build them.
"""

from setuptools import Extension, setup


def _compiled(name: str, source: str) -> Extension:
    """A compiled module; optional: a failed build leaves the Python loops in charge."""
    return Extension(name, sources=[source], optional=True,
                     extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                         "-Wno-missing-field-initializers"])


setup(ext_modules=[_compiled("decoder._fastrow", "decoder/_fastrow.c"),
                   _compiled("sinks._fastavro", "sinks/_fastavro.c")])
