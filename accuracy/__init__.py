"""Offline re-implementations of the MLPerf LLM accuracy scripts: decoding the accuracy log,
ROUGE with the reference's sentence splitting, generation-length statistics, the accuracy.txt
the checker reads, the check against the benchmark's targets, gpt-oss-120b's and DeepSeek-R1's
scripts with what they share (the LiveCodeBench sandbox, `code_sandbox.py`; the reference's table
and the decoded log, `scorer_inputs.py`), and the benchmark datasets (`datasets/`: the reader,
whose prompts feed the harness and whose references the scores, and the converters that write the
sets it reads). Knows nothing of the engine."""
