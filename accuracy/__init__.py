"""Offline re-implementations of the MLPerf accuracy scripts and per-benchmark targets. Not built yet."""
