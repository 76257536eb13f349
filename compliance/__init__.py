"""Compliance audits (TEST06, latency/validity), submission tree packaging and checking. Not built yet."""
