"""Which statement writes a slice of an enqueue_many() call (`Batch.statement`)."""

from __future__ import annotations

import pytest

from django_pgqueue.store.enqueue import Batch

OPTIONS = ("qa.noop", "bulk", 0, None, 0.0, 5)


def batch(*sequences: tuple[str, str] | None) -> Batch:
    jobs = Batch()
    group = jobs.add_group("options", OPTIONS)
    for sequence in sequences:
        jobs.add(group, sequence=sequence)
    return jobs


def test_sequenced_jobs_go_through_the_sequenced_statement():
    name, params = batch(("k", "hold"), ("k", "hold")).statement(0, 2)
    assert name == "job_enqueue_many_sequenced"
    assert params["sequence_keys"] == '{"k","k"}'


def test_jobs_without_keys_sharing_their_options_go_through_the_alike_statement():
    assert batch(None, None).statement(0, 2)[0] == "job_enqueue_many_alike"


def test_a_batch_of_plain_and_sequenced_jobs_is_written_part_by_part():
    mixed = batch(None, ("k", "hold"), None)
    with pytest.raises(ValueError, match="all sequenced or none"):
        mixed.statement(0, 3)
    assert mixed.select([0, 2]).statement(0, 2)[0] == "job_enqueue_many_alike"
    assert mixed.select([1]).statement(0, 1)[0] == "job_enqueue_many_sequenced"


def test_a_part_without_keys_takes_an_unkeyed_statement_though_other_jobs_had_keys():
    jobs = Batch()
    group = jobs.add_group("options", OPTIONS)
    jobs.add(group)
    jobs.add(group, idempotency_key="once")
    assert jobs.statement(0, 2)[0] == "job_enqueue_many_keyed"
    assert jobs.select([0]).statement(0, 1)[0] == "job_enqueue_many_alike"
    assert jobs.select([1]).statement(0, 1)[0] == "job_enqueue_many_keyed"
