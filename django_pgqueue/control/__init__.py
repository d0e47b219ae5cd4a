"""Queue control: pause, concurrency limits, concurrency keys, rate limits.

`limits` parses settings and arguments, `store` runs the statements (the worker's
controlled claim and the operator's writes), `api` is the Python surface re-exported
by ``django_pgqueue``. The tables are `django_pgqueue.models.controls`; the Queues page
is `django_pgqueue.admin.controls`.
"""
