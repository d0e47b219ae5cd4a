"""The data layer: the only code that runs the queue's SQL (the statements of `sql/`).

Split by who calls it and on which connection:

- `store.worker`: the worker's own connections (`Store`: claim, complete, fail, renew,
  release, sweep, LISTEN), outside Django's connection handling;
- `store.enqueue`: inserting jobs on the caller's Django connection, so a job exists
  only if the caller's transaction commits;
- `store.operator`: operator actions (retry, cancel) and the read-only figures and
  maintenance passes of the admin and the ops commands, on Django's connection;
- the features' statements, each feature's own: `store.control`, `store.schedules`,
  `store.observability`, `store.workflows`, `store.batches`, `store.indexes`.

`store.cursors` holds the Django-connection cursors they share, and `store.arrays` the
array literals every room sends.
"""
