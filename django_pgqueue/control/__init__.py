"""Queue control: pause, concurrency limits, concurrency keys, rate limits.

The limits themselves are parsed in ``django_pgqueue.limits`` (settings and arguments);
here, `store` is the operator's writes and the settings written at worker start,
`api` the Python surface re-exported by ``django_pgqueue``, and `extension` the
worker's part (PGQUEUE["QUEUES"] written at its start). The controlled claim is the
store's (``django_pgqueue.store.claims``), whether or not the extension is installed. The tables are
`django_pgqueue.models.controls`; the Queues page is `django_pgqueue.admin.controls`.
"""
