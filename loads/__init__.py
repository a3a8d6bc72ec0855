"""Table copies into the sinks: the initial load under the slot's exported snapshot and the
incremental snapshots taken while streaming, with their state files, readers and workers.

Below the application, above the sinks: a load writes read events through a
:class:`~sinks.sink.Sink`, resolved through the catalog of :mod:`snapshot_builder`.
"""
