"""Build of the compiled modules, decoder._fastrow, sinks._fastavro, sinks._fastjson and
sinks._loadfast (everything else is in pyproject.toml).

pgcdc works without them (decoder/tuples.py, sinks/avro.py and sinks/envelope.py fall back
to the same loops in Python), so a machine without a C compiler still installs; `make setup`
and CI build them.
"""

from setuptools import Extension, setup


def _compiled(name: str, source: str, *depends: str) -> Extension:
    """A compiled module; optional: a failed build leaves the Python loops in charge."""
    return Extension(name, sources=[source], depends=list(depends), optional=True,
                     extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                         "-Wno-missing-field-initializers"])


setup(ext_modules=[_compiled("decoder._fastrow", "decoder/_fastrow.c"),
                   _compiled("sinks._fastavro", "sinks/_fastavro.c", "sinks/_avrobuf.h"),
                   _compiled("sinks._fastjson", "sinks/_fastjson.c", "sinks/_jsonbuf.h"),
                   _compiled("sinks._loadfast", "sinks/_loadfast.c", "sinks/_avrobuf.h",
                             "sinks/_loadfast_rdkafka.h", "sinks/_loadfast_text.h",
                             "sinks/_loadfast_libpq.h", "sinks/_loadfast_json.h",
                             "sinks/_jsonbuf.h")])
