"""The one seeded task order: the draws every program made before it had one source."""
import random
from dataclasses import replace

import pytest

from lit_ascent.stream_order import stream_order, stream_tasks
from lit_ascent.trajectory import Task

TASKS = [Task("env", f"t{i}", meta=(("family", "abc"[i % 3]),)) for i in range(11)]


def reference_tasks(tasks, num_tasks, seed, shuffle=True, balance_by=None):
    """The stream's tasks as its data module numbered them: cut, then reset seeds from seed + 1."""
    ordered = stream_order(tasks, seed, shuffle, balance_by)
    ordered = ordered[:num_tasks] if num_tasks else ordered
    rng = random.Random(seed + 1)
    return [replace(t, index=i, seed=rng.randrange(2**31)) for i, t in enumerate(ordered)]


def test_plain_order_is_one_seeded_shuffle():
    order = list(TASKS)
    random.Random(5).shuffle(order)
    assert stream_order(TASKS, 5) == order
    assert stream_order(TASKS, 5, shuffle=False) == TASKS


@pytest.mark.parametrize("num_tasks", [None, 1, 4, 11, 20])
@pytest.mark.parametrize("balance_by", [None, "family"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_stream_tasks_are_the_streams_draws(num_tasks, balance_by, shuffle):
    got = stream_tasks(TASKS, num_tasks, 3, shuffle, balance_by)
    assert got == reference_tasks(TASKS, num_tasks, 3, shuffle, balance_by)
    assert [t.index for t in got] == list(range(min(num_tasks or len(TASKS), len(TASKS))))


def test_a_prefix_keeps_its_reset_seeds():
    assert stream_tasks(TASKS, 4, 7) == stream_tasks(TASKS, None, 7)[:4]


def test_empty_cut_is_rejected():
    with pytest.raises(ValueError, match="num_tasks"):
        stream_tasks(TASKS, 0, 0)
