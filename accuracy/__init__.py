"""Offline re-implementations of the MLPerf LLM accuracy scripts: decoding the accuracy log,
ROUGE with the reference's sentence splitting, generation-length statistics, the accuracy.txt
the checker reads, the check against the benchmark's targets, and the reader of the benchmark
datasets (their prompts feed the harness, their references the scores). Knows nothing of the engine."""
