"""Predict, then measure: a configuration's capacity at the latency limits from the engine's own
scheduler run on a virtual clock (sut/clock.py) against a step-cost model fitted on the machine,
fed LoadGen's own schedule and judged by LoadGen's own rules. README: harness/README.md."""
