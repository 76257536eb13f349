"""Compliance: the TEST06 verification, the latency and validity audit of a LoadGen run, the v6.1
submission tree (packaging) and our checker of it. Reads LoadGen logs only; never the engine."""
