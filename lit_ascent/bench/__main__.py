"""``python -m lit_ascent.bench``: the stream throughput and memory bench (``lit_ascent.bench.throughput``)."""
from lit_ascent.bench.throughput import main

main()
