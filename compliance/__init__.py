"""Compliance: the TEST06 verification and gpt-oss-120b's TEST07 and TEST09, the latency and validity
audit of a LoadGen run, the run identity check (which run a detail log is of), the v6.1 submission
tree (packaging) and our checker of it. Reads LoadGen logs only, never the engine; the `make
submission` chain that runs the harness and then these is harness/submission.py."""
