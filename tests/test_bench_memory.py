"""The memory bench's child process measures what the chunked divergence saves."""
from __future__ import annotations

from lit_ascent.bench.memory import measure_memory


def test_chunked_divergence_peaks_below_the_unchunked_one_at_smollm2_head_shape():
    r = measure_memory(["div_chunked", "div_unchunked"], "bfloat16", 1024)
    for case in r.values():
        assert "error" not in case, case
        assert case["peak_kib"] >= case["before_kib"] > 0
    # unchunked: [1024, 49152] logits of student and teacher at once, with their softmax and gradients;
    # chunked: 128 rows at a time (docs/results/bench.md: chunked / unchunked 0.23 net of the runtime)
    chunked = r["div_chunked"]["peak_kib"] - r["div_chunked"]["before_kib"]
    unchunked = r["div_unchunked"]["peak_kib"] - r["div_unchunked"]["before_kib"]
    assert unchunked > 2 * chunked, (chunked, unchunked)
