"""Queue control: pause, concurrency limits, concurrency keys, rate limits (issue 14).

`limits` parses settings and arguments, `store` runs the statements (the worker's
controlled claim and the operator's writes), `api` is the Python surface re-exported
by ``django_pgqueue``, `admin` the Queues page.
"""
