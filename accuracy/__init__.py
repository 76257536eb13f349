"""Offline re-implementations of the MLPerf LLM accuracy scripts: decoding the accuracy log,
ROUGE with the reference's sentence splitting, generation-length statistics, the accuracy.txt
the checker reads, and per-benchmark targets. Knows nothing of the engine."""
