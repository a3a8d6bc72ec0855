"""The base of every pgcdc package: imports nothing of the project.

:mod:`core.errors` holds the root of the error hierarchy with its transient / terminal
mixins, :mod:`core.failpoints` the named fail points of the crash tests.
"""
