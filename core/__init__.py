"""The base of every pgcdc package: imports nothing of the project.

:mod:`core.errors` holds the root of the error hierarchy with its transient / terminal
mixins, :mod:`core.failpoints` the named fail points of the crash tests, :mod:`core.wire`
the topic and header names the Kafka sink writes and the Spark job reads.  Standard library
only (tests/unit/test_layers.py).
"""
