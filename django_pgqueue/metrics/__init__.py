"""Prometheus metrics (the ``prometheus`` extra: ``pip install django-pgqueue-jobs[prometheus]``).

- `collector.QueueCollector`: the queues' figures from the database (pending, due,
  oldest due age, running, expired leases, dead, cancelled, workers), read with index
  walks and estimates on every scrape, never a scan of the job tables.
- `collector.WorkerCollector`: a worker process's own counters (attempts by outcome,
  handler run-time histograms).
- `views.metrics`: a Django view serving the queue figures from the web process.
- `server.serve`: the worker's ``--metrics-port``, serving both.
"""
