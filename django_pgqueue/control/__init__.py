"""Queue control: pause, concurrency limits, concurrency keys, rate limits.

The limits themselves are parsed in ``django_pgqueue.limits`` (settings and arguments);
here, `claims` is the worker's side (the controlled claim, when to try a queue again),
`store` the operator's writes, `api` the Python surface re-exported by
``django_pgqueue``, and `extension` plugs it into the worker. The tables are
`django_pgqueue.models.controls`; the Queues page is `django_pgqueue.admin.controls`.
"""
