"""The load a latency scenario (Server, Interactive) can sustain on this machine, measured before
its LoadGen runs, so that `make submission` runs it at a rate the machine meets instead of one
fixed number (CPUs differ by 2x and more for this work).

    python -m harness.calibrate --system cpu-demo --benchmark llama3.1-8b --scenario Server

How (in-process, no LoadGen; the engine with the scenario's settings on the benchmark's samples):
1. Floors: the time to first token of the dataset's longest prompt alone, and a decode step at
   batch 1. A scenario whose floors reach FLOOR_SHARE of its TTFT or TPOT limit cannot be met
   here: it is left out, and the reason says which floor and by how much.
2. Capacity: CAPACITY_SECONDS of Poisson arrivals at a first rate (sample indices and gaps from a
   fixed seed); the engine's busy share of that time u gives capacity ~ rate / u (an underestimate:
   batches grow with load, and a step's cost less than in proportion).
3. Target: MARGIN of that capacity, checked by a second probe at the target rate: every first
   token under TTFT_TAIL_SHARE of the TTFT limit and every TPOT under TPOT_TAIL_SHARE of the TPOT
   limit (PROBE_SECONDS each), else the rate drops by PROBE_STEP and it probes again, PROBES
   times at most. LoadGen's
   early stopping allows no sample over a limit in a 460-query run, whose slowest first token is
   later than a one-minute probe's (on 2 cores: 1.6x from 41 to 171 requests at the same rate),
   hence half the TTFT limit; TPOT, held by the scheduler's tpot_target_ms, moves less.

The result goes to `<log dir>/calibration/` (calibration.json, and user.conf: the committed one
with target_qps replaced), which `python -m harness run --user-conf` and the packager then use, so
the submission tree says what was run and why.
"""

import argparse
import json
import random
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.config import REPO, HarnessConfigError, RunConfig, loadgen_model_name
from harness.dataset import DatasetError, load_cnn_eval

# (p99 TTFT, p99 TPOT) limits in ms, as mlperf.conf sets them for LoadGen (compliance/audit.py).
from compliance.audit import LATENCY_LIMITS_MS

FLOOR_SHARE = 0.6  # a floor above this share of a limit leaves no room for queueing
CAPACITY_SECONDS = 30.0
PROBE_SECONDS = 60.0
PROBE_STEP = 0.85
FIRST_RATE_SHARE = 0.5  # the first probe's rate, as a share of the floors' crude capacity bound
MARGIN = 0.42  # of the measured capacity
TTFT_TAIL_SHARE = 0.5  # of the TTFT limit, for a probe's slowest first token
TPOT_TAIL_SHARE = 0.85  # of the TPOT limit, for a probe's slowest TPOT
PROBES = 3
SEED = 2085463073848966840 % 2**32  # from the v6.1 qsl seed: fixed, so a probe is reproducible


@dataclass
class Probe:
    qps: float
    seconds: float
    requests: int
    completed: int
    busy_share: float
    max_ttft_ms: float
    p99_ttft_ms: float
    max_tpot_ms: float
    p99_tpot_ms: float

    def meets(self, ttft_limit_ms: float, tpot_limit_ms: float) -> bool:
        return (self.completed == self.requests and self.max_ttft_ms < TTFT_TAIL_SHARE * ttft_limit_ms
                and self.max_tpot_ms < TPOT_TAIL_SHARE * tpot_limit_ms)


@dataclass
class Calibration:
    scenario: str
    ttft_limit_ms: float
    tpot_limit_ms: float
    ttft_floor_ms: float  # the longest prompt alone
    tpot_floor_ms: float  # a decode step at batch 1
    capacity_qps: float | None = None
    target_qps: float | None = None
    probes: list[Probe] = field(default_factory=list)
    reason: str = ""  # why the scenario is left out, when target_qps is None

    def summary(self) -> str:
        floors = (f"floors: TTFT {self.ttft_floor_ms:.0f} ms (longest prompt alone), TPOT {self.tpot_floor_ms:.1f} ms "
                  f"(decode at batch 1); limits {self.ttft_limit_ms:.0f} / {self.tpot_limit_ms:.0f} ms")
        if self.target_qps is None:
            return f"{self.scenario}: left out: {self.reason} ({floors})"
        last = self.probes[-1]
        return (f"{self.scenario}: target_qps {self.target_qps:.3f} ({MARGIN:.0%} of a measured capacity of "
                f"{self.capacity_qps:.3f} QPS, checked by a {last.seconds:.0f} s probe: max TTFT "
                f"{last.max_ttft_ms:.0f} ms, max TPOT {last.max_tpot_ms:.1f} ms); {floors}")


def replay(engine, prompts: list[list[int]], params, qps: float, seconds: float, seed: int = SEED) -> Probe:
    """Poisson arrivals at `qps` for `seconds` (then the engine drains what arrived), stepped in
    this thread as the LoadGen harness does; latencies as LoadGen measures them (TTFT from the
    arrival, TPOT = (end - first token) / (tokens - 1))."""
    rng = random.Random(seed)
    arrivals, t = [], rng.expovariate(qps)
    while t < seconds:
        arrivals.append((t, rng.randrange(len(prompts))))
        t += rng.expovariate(qps)
    first, done, tokens = {}, {}, {}
    start, busy, next_arrival = time.perf_counter(), 0.0, 0

    def on_token(i):
        def record(_token):
            first.setdefault(i, time.perf_counter() - start)
        return record

    while next_arrival < len(arrivals) or engine.has_unfinished():
        now = time.perf_counter() - start
        while next_arrival < len(arrivals) and arrivals[next_arrival][0] <= now:
            engine.add_request(prompts[arrivals[next_arrival][1]], params, request_id=next_arrival,
                               on_token=on_token(next_arrival))
            next_arrival += 1
        if not engine.has_unfinished():
            time.sleep(max(0.0, min(arrivals[next_arrival][0] - now, 0.05)))
            continue
        step_start = time.perf_counter()
        for out in engine.step():
            done[out.request_id] = time.perf_counter() - start
            tokens[out.request_id] = len(out.token_ids)
        if step_start - start < seconds:
            busy += time.perf_counter() - step_start
    ttft = [(first[i] - arrivals[i][0]) * 1000 for i in done if i in first]
    tpot = [(done[i] - first[i]) * 1000 / (tokens[i] - 1) for i in done if i in first and tokens[i] > 1]
    return Probe(qps, seconds, len(arrivals), len(done), busy / seconds, max(ttft, default=0.0),
                 _p99(ttft), max(tpot, default=0.0), _p99(tpot))


def _p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(0.99 * len(values)))] if values else 0.0


def _floors(engine, prompts, params) -> tuple[float, float]:
    longest = max(prompts, key=len)
    engine.add_request(longest, params, request_id="floor-ttft", on_token=lambda _t: None)
    start = time.perf_counter()
    engine.step()  # the whole prompt fits one step's budget, or the first token comes later
    while not engine.scheduler.running or engine.scheduler.running[0].first_token_time is None:
        engine.step()
    ttft = time.perf_counter() - start
    steps = []
    for _ in range(8):
        step_start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - step_start)
    engine.abort("floor-ttft")
    while engine.has_unfinished():
        engine.step()
    return ttft * 1000, statistics.median(steps) * 1000


def calibrate(engine, prompts: list[list[int]], params, scenario: str, ttft_limit_ms: float, tpot_limit_ms: float,
              probe_seconds: float = PROBE_SECONDS, log=print) -> Calibration:
    warm = prompts[0][:16]
    engine.add_request(warm, params, request_id="warm-up")
    while engine.has_unfinished():
        engine.step()
    ttft_floor, tpot_floor = _floors(engine, prompts, params)
    cal = Calibration(scenario, ttft_limit_ms, tpot_limit_ms, ttft_floor, tpot_floor)
    log(f"calibrate {scenario}: TTFT floor {ttft_floor:.0f} ms, TPOT floor {tpot_floor:.1f} ms")
    if ttft_floor >= FLOOR_SHARE * ttft_limit_ms or tpot_floor >= FLOOR_SHARE * tpot_limit_ms:
        which = (f"the longest prompt alone takes {ttft_floor:.0f} ms to its first token"
                 if ttft_floor >= FLOOR_SHARE * ttft_limit_ms else f"a decode step at batch 1 takes {tpot_floor:.1f} ms")
        limit = ttft_limit_ms if ttft_floor >= FLOOR_SHARE * ttft_limit_ms else tpot_limit_ms
        cal.reason = (f"{which}, {FLOOR_SHARE:.0%} or more of the {limit:.0f} ms limit before any queueing, so no "
                      "load meets the limits on this machine")
        return cal
    # A crude upper bound on capacity: every request's prompt at the floor's rate, alone.
    mean_prompt = statistics.mean(map(len, prompts))
    rate = FIRST_RATE_SHARE * 1000 / (ttft_floor * mean_prompt / max(map(len, prompts)) + 30 * tpot_floor)
    probe = replay(engine, prompts, params, rate, probe_seconds * CAPACITY_SECONDS / PROBE_SECONDS)
    cal.probes.append(probe)
    cal.capacity_qps = rate / max(probe.busy_share, 1e-3)
    target = MARGIN * cal.capacity_qps
    log(f"calibrate {scenario}: {rate:.3f} QPS kept the engine busy {probe.busy_share:.0%} of the time: "
        f"capacity ~{cal.capacity_qps:.3f} QPS; probing {target:.3f}")
    for _ in range(PROBES):
        probe = replay(engine, prompts, params, target, probe_seconds)
        cal.probes.append(probe)
        log(f"calibrate {scenario}: {target:.3f} QPS: {probe.completed}/{probe.requests} done, max TTFT "
            f"{probe.max_ttft_ms:.0f} ms, max TPOT {probe.max_tpot_ms:.1f} ms")
        if probe.meets(ttft_limit_ms, tpot_limit_ms):
            cal.target_qps = target
            return cal
        target *= PROBE_STEP
    cal.reason = (f"no probe rate kept its slowest first token under {TTFT_TAIL_SHARE:.0%} of the TTFT limit and its "
                  f"slowest TPOT under {TPOT_TAIL_SHARE:.0%} of the TPOT limit (the last, {cal.probes[-1].qps:.3f} QPS: max TTFT "
                  f"{cal.probes[-1].max_ttft_ms:.0f} ms, max TPOT {cal.probes[-1].max_tpot_ms:.1f} ms)")
    return cal


def calibrated_user_conf(committed: Path, loadgen_model: str, target_qps: float) -> str:
    """The committed user.conf with the scenario's target_qps replaced, and a comment saying so."""
    key = re.compile(rf"^\s*{re.escape(loadgen_model)}\.Server\.target_qps\s*=.*$", re.MULTILINE)
    text = committed.read_text()
    line = f"{loadgen_model}.Server.target_qps = {target_qps:.4f}"
    text = key.sub(line, text) if key.search(text) else text.rstrip("\n") + "\n" + line + "\n"
    return f"# target_qps calibrated on this machine by harness.calibrate (calibration.json beside this file)\n{text}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmark", default="llama3.1-8b")
    parser.add_argument("--scenario", default="Server", choices=["Server", "Interactive"])
    parser.add_argument("--probe-seconds", type=float, default=PROBE_SECONDS)
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args()
    try:
        cfg = RunConfig.resolve(args.system, args.benchmark, args.scenario, "performance", args.root)
        dataset = load_cnn_eval(cfg.system.datasets[cfg.benchmark.name])
    except (HarnessConfigError, DatasetError) as e:
        sys.exit(f"calibrate: {e}")
    from sut import LLMEngine, SamplingParams

    engine = LLMEngine(cfg.system.model, **cfg.system.engine_settings(args.scenario))
    params = SamplingParams(max_tokens=cfg.benchmark.max_new_tokens, min_tokens=1)
    ttft_limit, tpot_limit = LATENCY_LIMITS_MS[cfg.benchmark.loadgen_model][args.scenario]
    cal = calibrate(engine, dataset.input_ids, params, args.scenario, ttft_limit, tpot_limit, args.probe_seconds)
    out = cfg.log_dir.parent / "calibration"
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps({**asdict(cal), "summary": cal.summary()}, indent=2) + "\n")
    if cal.target_qps is not None:
        (out / "user.conf").write_text(calibrated_user_conf(cfg.user_conf, loadgen_model_name(cfg.benchmark, args.scenario),
                                                            cal.target_qps))
    elif (out / "user.conf").exists():
        (out / "user.conf").unlink()
    print(f"calibrate: {cal.summary()}; in {out}")


if __name__ == "__main__":
    main()
