"""Build of the compiled modules, decoder._fastrow and sinks._fastavro (everything else is in
pyproject.toml).

pgcdc works without them (decoder/tuples.py and sinks/avro.py fall back to the same loops in
Python), so a machine without a C compiler still installs; `make setup` and CI build them.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "decoder._fastrow",
            sources=["decoder/_fastrow.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
            optional=True,
        ),
        Extension(
            "sinks._fastavro",
            sources=["sinks/_fastavro.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
            optional=True,
        ),
    ],
)
