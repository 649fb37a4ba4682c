"""Benchmarks, one program each: ``python -m lit_ascent.bench`` (stream throughput and memory,
``throughput``), ``.memory`` (one update's peak memory, a child process per case), ``.engines``
(rollout engines against the machine's bounds), ``.cuda`` (the same on a GPU), ``.replay`` (a replayed
episode's cost) and ``.ray_streams`` (the comparison matrix on Ray against the serial executor)."""
