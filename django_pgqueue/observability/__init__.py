"""Seeing the queue: signals, counters, the worker registry, the per-minute rollup,
OpenTelemetry spans and the admin's charts.

Nothing here decides anything about a job: ownership is the lease's. The registry
and the rollup are written by the worker's heartbeat (see `hooks.Observer`, plugged in
by `extension`) and read by the admin's Workers and Charts pages
(`django_pgqueue.admin.observability`), ``queue_stats`` and the Prometheus collector.
The tables are `django_pgqueue.models.observability`.
"""
