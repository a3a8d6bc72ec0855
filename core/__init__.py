"""The base of every pgcdc package: imports nothing of the project.

:mod:`core.errors` holds the root of the error hierarchy with its transient / terminal
mixins, :mod:`core.failpoints` the named fail points of the crash tests, :mod:`core.wire`
the names the Kafka sink writes and the Spark job reads (topics, headers, envelope fields,
catalog record keys), :mod:`core.java`
and :mod:`core.maven` the Java runtime and the Maven Central jars the JVM services (Kafka,
Spark, the schema registry) start with.  Standard library only (tests/unit/test_layers.py).
"""
