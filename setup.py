"""Build of the one compiled module, decoder._fastrow (everything else is in pyproject.toml).

pgcdc works without it (decoder/tuples.py falls back to the same loop in Python), so a
machine without a C compiler still installs; `make setup` and CI build it.
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
    ],
)
