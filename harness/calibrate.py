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
3. Rehearsal: from MARGIN of that capacity, on the run's own hardest minute. LoadGen draws the
   Server arrivals from the v6.1 schedule seed, so at any target_qps they are one sequence of
   times scaled by 1/target_qps, with the same samples: `loadgen_schedule` gets it from LoadGen
   itself (a run at 1000 QPS against a SUT that answers at once), and the probe replays the
   WINDOW_SECONDS around the BURST_SECONDS in which the most prompt tokens arrive at the candidate
   rate. LoadGen's early stopping allows no sample over a limit in a 460-query run, and a
   one-minute stretch of Poisson arrivals rarely holds that run's worst burst (README). Every first
   token must stay under TTFT_TAIL_SHARE of the TTFT limit and every TPOT under TPOT_TAIL_SHARE of
   the TPOT limit, in each of REPLAYS replays (a burst's slowest first token moves by tens of
   percent between two replays of the same arrivals, with the order in which steps happen to fall,
   so one pass is a sample, not a bound); else the rate drops by PROBE_STEP and it rehearses
   again, at most PROBES rates.
4. The target is RUN_SHARE of the rate that passed. The LoadGen runs' slowest first tokens have come
   out 1.4-1.9x their replays' at the same rate, in the same burst (README, "Measured", K and L: the
   replays reproduce the arrivals, not yet the run), and LoadGen's early stopping allows none over
   the limit in a 460-query run, so the latency shares alone are not margin enough.

The result goes to `<log dir>/calibration/` (calibration.json, and user.conf: the committed one
with target_qps replaced), which `python -m harness run --user-conf` and the packager then use, so
the submission tree says what was run and why.
"""

import argparse
import dataclasses
import json
import random
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accuracy.dataset import DatasetError, load_dataset
from harness.config import HarnessConfigError, RunConfig
from systems.benchmarks import with_target_qps
from systems.schema import REPO

FLOOR_SHARE = 0.6  # a floor above this share of a limit leaves no room for queueing
CAPACITY_SECONDS = 30.0
WINDOW_SECONDS = (15.0, 15.0)  # replayed before and after the start of the worst burst (a request lives ~1 s)
BURST_SECONDS = 5.0
PROBE_STEP = 0.85
SCHEDULE_QPS = 1000.0
FIRST_RATE_SHARE = 0.5  # the first probe's rate, as a share of the floors' crude capacity bound
MARGIN = 0.3  # of the capacity estimate (throughput, far above what meets the limits): the first rate rehearsed
TTFT_TAIL_SHARE = 0.65  # of the TTFT limit, for a rehearsal's slowest first token (0.8 let LoadGen runs on a
# noisy machine go over the limit: README, "Measured", J and K)
TPOT_TAIL_SHARE = 0.9  # of the TPOT limit, for a rehearsal's slowest TPOT
RUN_SHARE = 0.8  # of the rate that passed its rehearsals: the rate the LoadGen runs take
PROBES = 5  # rates rehearsed at most
REPLAYS = 2  # of each rate's window, all of which must pass
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
        return (
            self.completed == self.requests
            and self.max_ttft_ms < TTFT_TAIL_SHARE * ttft_limit_ms
            and self.max_tpot_ms < TPOT_TAIL_SHARE * tpot_limit_ms
        )


@dataclass
class Calibration:
    scenario: str
    ttft_limit_ms: float
    tpot_limit_ms: float
    ttft_floor_ms: float  # the longest prompt alone
    tpot_floor_ms: float  # a decode step at batch 1
    capacity_qps: float | None = None
    passed_qps: float | None = None  # the rate whose rehearsals passed; target_qps is RUN_SHARE of it
    target_qps: float | None = None
    probes: list[Probe] = field(default_factory=list)
    reason: str = ""  # why the scenario is left out, when target_qps is None

    def summary(self) -> str:
        floors = (
            f"floors: TTFT {self.ttft_floor_ms:.0f} ms (longest prompt alone), TPOT {self.tpot_floor_ms:.1f} ms "
            f"(decode at batch 1); limits {self.ttft_limit_ms:.0f} / {self.tpot_limit_ms:.0f} ms"
        )
        if self.target_qps is None:
            return f"{self.scenario}: left out: {self.reason} ({floors})"
        passed = [p for p in self.probes if p.qps == self.passed_qps]
        return (
            f"{self.scenario}: target_qps {self.target_qps:.3f}, {RUN_SHARE:.0%} of {self.passed_qps:.3f}, at which "
            f"LoadGen's hardest {passed[0].seconds:.0f} s replayed {len(passed)} times had slowest first tokens of "
            f"{' / '.join(f'{p.max_ttft_ms:.0f}' for p in passed)} ms and TPOT of "
            f"{' / '.join(f'{p.max_tpot_ms:.1f}' for p in passed)} ms (measured capacity {self.capacity_qps:.3f} QPS); "
            f"{floors}"
        )


def poisson_arrivals(qps: float, seconds: float, num_samples: int, seed: int = SEED) -> list[tuple[float, int]]:
    """(arrival time in s, sample index) of Poisson arrivals at `qps` for `seconds`."""
    rng = random.Random(seed)
    arrivals, t = [], rng.expovariate(qps)
    while t < seconds:
        arrivals.append((t, rng.randrange(num_samples)))
        t += rng.expovariate(qps)
    return arrivals


def replay(
    engine, prompts: list[list[int]], params, qps: float, arrivals: list[tuple[float, int]], seconds: float
) -> Probe:
    """`arrivals` (time, sample index) in real time, then the engine drains what arrived, stepped
    in this thread as the LoadGen harness does; latencies as LoadGen measures them (TTFT from the
    arrival, TPOT = (end - first token) / (tokens - 1)); `seconds` is the span the busy share is of."""
    first, done, tokens = {}, {}, {}
    start, busy, next_arrival = time.perf_counter(), 0.0, 0

    def on_token(i):
        def record(_token):
            first.setdefault(i, time.perf_counter() - start)

        return record

    while next_arrival < len(arrivals) or engine.has_unfinished():
        now = time.perf_counter() - start
        while next_arrival < len(arrivals) and arrivals[next_arrival][0] <= now:
            engine.add_request(
                prompts[arrivals[next_arrival][1]],
                params,
                request_id=f"probe-{next_arrival}",
                on_token=on_token(next_arrival),
            )
            next_arrival += 1
        if not engine.has_unfinished():
            time.sleep(max(0.0, min(arrivals[next_arrival][0] - now, 0.05)))
            continue
        step_start = time.perf_counter()
        for out in engine.step():
            i = int(out.request_id.removeprefix("probe-"))
            done[i] = time.perf_counter() - start
            tokens[i] = len(out.token_ids)
        if step_start - start < seconds:
            busy += time.perf_counter() - step_start
    ttft = [(first[i] - arrivals[i][0]) * 1000 for i in done if i in first]
    tpot = [(done[i] - first[i]) * 1000 / (tokens[i] - 1) for i in done if i in first and tokens[i] > 1]
    return Probe(
        qps,
        seconds,
        len(arrivals),
        len(done),
        busy / seconds,
        max(ttft, default=0.0),
        _p99(ttft),
        max(tpot, default=0.0),
        _p99(tpot),
    )


def loadgen_schedule(user_conf: Path, loadgen_model: str, num_samples: int) -> list[tuple[float, int]]:
    """LoadGen's Server schedule for these settings as (arrival time at 1 QPS, sample index), from
    a LoadGen run at SCHEDULE_QPS whose SUT answers every sample at once (a process's only run:
    LoadGen loads mlperf.conf, and with it the schedule seed, on its first FromConfig alone)."""
    import tempfile

    import mlperf_loadgen as lg
    import numpy as np

    settings = lg.TestSettings()
    if settings.FromConfig(str(user_conf), loadgen_model, "Server"):
        raise HarnessConfigError(f"{user_conf}: LoadGen refused it")
    settings.scenario, settings.mode = lg.TestScenario.Server, lg.TestMode.PerformanceOnly
    settings.server_target_qps, settings.min_duration_ms = SCHEDULE_QPS, 0
    settings.max_query_count = settings.min_query_count
    answer = np.array([1, 2], dtype=np.int32)  # two tokens, so token latencies are defined

    def issue(samples):
        responses = [lg.QuerySampleResponse(s.id, answer.ctypes.data, answer.nbytes, 2) for s in samples]
        lg.FirstTokenComplete(responses)
        lg.QuerySamplesComplete(responses)

    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(
        num_samples,
        min(num_samples, settings.performance_sample_count_override or num_samples),
        lambda _: None,
        lambda _: None,
    )
    with tempfile.TemporaryDirectory() as out:
        log = lg.LogSettings()
        log.log_output.outdir, log.log_output.copy_summary_to_stdout = out, False
        lg.StartTestWithLogSettings(sut, qsl, settings, log, f"{out}/no-audit.config")
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
        begins = [
            line for line in open(f"{out}/mlperf_log_trace.json") if '"name":"Sample"' in line and '"ph":"b"' in line
        ]
    arrivals = sorted(
        (
            float(re.search(r'"ts":([\d.]+)', line).group(1)) / 1e6 * SCHEDULE_QPS,
            int(re.search(r'"sample_idx":(\d+)', line).group(1)),
        )
        for line in begins
    )
    return [(t - arrivals[0][0], i) for t, i in arrivals]


def worst_window(schedule: list[tuple[float, int]], prompts: list[list[int]], qps: float) -> list[tuple[float, int]]:
    """The arrivals of `schedule` at `qps` from WINDOW_SECONDS[0] before to WINDOW_SECONDS[1] after
    the start of the BURST_SECONDS holding the most prompt tokens, times from the window's start."""
    times = [t / qps for t, _ in schedule]
    tokens = [len(prompts[i]) for _, i in schedule]
    best, best_tokens, end, window = 0, -1, 0, 0
    for start in range(len(times)):  # a sliding window over the sorted arrivals
        while end < len(times) and times[end] < times[start] + BURST_SECONDS:
            window += tokens[end]
            end += 1
        if window > best_tokens:
            best, best_tokens = start, window
        window -= tokens[start]
    lo, hi = times[best] - WINDOW_SECONDS[0], times[best] + WINDOW_SECONDS[1]
    return [(t - max(lo, 0.0), i) for t, (_, i) in zip(times, schedule) if lo <= t <= hi]


def _p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(0.99 * len(values)))] if values else 0.0


def _floors(engine, prompts, params) -> tuple[float, float]:
    """The longest prompt alone: milliseconds to its first token, and the median between its next
    ones (a decode step at batch 1), from the times its tokens arrive (one engine or replicas)."""
    longest = max(prompts, key=len)
    arrived: list[float] = []
    start = time.perf_counter()
    engine.add_request(
        longest,
        dataclasses.replace(params, max_tokens=9, ignore_eos=True),
        request_id="floor-ttft",
        on_token=lambda _t: arrived.append(time.perf_counter()),
    )
    while engine.has_unfinished():
        engine.step()
    gaps = [b - a for a, b in zip(arrived, arrived[1:])]
    return (arrived[0] - start) * 1000, statistics.median(gaps) * 1000


def calibrate(
    engine,
    prompts: list[list[int]],
    params,
    scenario: str,
    ttft_limit_ms: float,
    tpot_limit_ms: float,
    schedule: list[tuple[float, int]],
    probe_seconds: float = CAPACITY_SECONDS,
    log=print,
) -> Calibration:
    """`schedule`: LoadGen's (loadgen_schedule) arrivals at 1 QPS, whose hardest stretch is rehearsed."""
    warm = prompts[0][:16]
    engine.add_request(warm, params, request_id="warm-up")
    while engine.has_unfinished():
        engine.step()
    ttft_floor, tpot_floor = _floors(engine, prompts, params)
    cal = Calibration(scenario, ttft_limit_ms, tpot_limit_ms, ttft_floor, tpot_floor)
    log(f"calibrate {scenario}: TTFT floor {ttft_floor:.0f} ms, TPOT floor {tpot_floor:.1f} ms")
    if ttft_floor >= FLOOR_SHARE * ttft_limit_ms or tpot_floor >= FLOOR_SHARE * tpot_limit_ms:
        which = (
            f"the longest prompt alone takes {ttft_floor:.0f} ms to its first token"
            if ttft_floor >= FLOOR_SHARE * ttft_limit_ms
            else f"a decode step at batch 1 takes {tpot_floor:.1f} ms"
        )
        limit = ttft_limit_ms if ttft_floor >= FLOOR_SHARE * ttft_limit_ms else tpot_limit_ms
        cal.reason = (
            f"{which}, {FLOOR_SHARE:.0%} or more of the {limit:.0f} ms limit before any queueing, so no "
            "load meets the limits on this machine"
        )
        return cal
    # A crude upper bound on capacity: every request's prompt at the floor's rate, alone.
    mean_prompt = statistics.mean(map(len, prompts))
    rate = FIRST_RATE_SHARE * 1000 / (ttft_floor * mean_prompt / max(map(len, prompts)) + 30 * tpot_floor)
    probe = replay(engine, prompts, params, rate, poisson_arrivals(rate, probe_seconds, len(prompts)), probe_seconds)
    cal.probes.append(probe)
    cal.capacity_qps = rate / max(probe.busy_share, 1e-3)
    target = MARGIN * cal.capacity_qps
    log(
        f"calibrate {scenario}: {rate:.3f} QPS kept the engine busy {probe.busy_share:.0%} of the time: "
        f"capacity ~{cal.capacity_qps:.3f} QPS; rehearsing {target:.3f}"
    )
    for _ in range(PROBES):
        arrivals = worst_window(schedule, prompts, target)
        for replay_number in range(1, REPLAYS + 1):
            probe = replay(engine, prompts, params, target, arrivals, sum(WINDOW_SECONDS))
            cal.probes.append(probe)
            log(
                f"calibrate {scenario}: {target:.3f} QPS, LoadGen's hardest {sum(WINDOW_SECONDS):.0f} s, replay "
                f"{replay_number}: {probe.completed}/{probe.requests} done, max TTFT {probe.max_ttft_ms:.0f} ms, "
                f"max TPOT {probe.max_tpot_ms:.1f} ms"
            )
            if not probe.meets(ttft_limit_ms, tpot_limit_ms):
                break
        else:
            cal.passed_qps, cal.target_qps = target, RUN_SHARE * target
            return cal
        target *= PROBE_STEP
    last = cal.probes[-1]
    cal.reason = (
        f"no rate kept LoadGen's hardest {sum(WINDOW_SECONDS):.0f} s, in {REPLAYS} replays, under "
        f"{TTFT_TAIL_SHARE:.0%} of the TTFT limit and {TPOT_TAIL_SHARE:.0%} of the TPOT limit (the last, "
        f"{last.qps:.3f} QPS: max TTFT {last.max_ttft_ms:.0f} ms, max TPOT {last.max_tpot_ms:.1f} ms)"
    )
    return cal


def calibrated_user_conf(committed: Path, loadgen_model: str, target_qps: float) -> str:
    """The committed user.conf with the scenario's target_qps replaced, and a comment saying so."""
    text = with_target_qps(committed.read_text(), loadgen_model, "Server", f"{target_qps:.4f}")
    return f"# target_qps calibrated on this machine by harness.calibrate (calibration.json beside this file)\n{text}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmark", default="llama3.1-8b")
    parser.add_argument("--scenario", default="Server", choices=["Server", "Interactive"])
    parser.add_argument("--probe-seconds", type=float, default=CAPACITY_SECONDS, help="of the capacity probe")
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args()
    from sut import SaafError, SamplingParams, make_engine

    try:
        cfg = RunConfig.resolve(args.system, args.benchmark, args.scenario, "performance", args.root)
        if args.scenario not in cfg.benchmark.latency_limits_ms:
            raise HarnessConfigError(f"{cfg.benchmark.name} has no {args.scenario} scenario (no TTFT/TPOT limits)")
        dataset = load_dataset(cfg.system.datasets[cfg.benchmark.name])
        engine = make_engine(
            cfg.system.model_for(cfg.benchmark.name), **cfg.system.engine_settings(args.scenario, cfg.benchmark.name)
        )
    except (HarnessConfigError, DatasetError, SaafError) as e:
        sys.exit(f"error: calibrate: {e}")
    params = SamplingParams(max_tokens=cfg.benchmark.max_new_tokens, min_tokens=cfg.benchmark.min_new_tokens)
    ttft_limit, tpot_limit = cfg.benchmark.latency_limits_ms[args.scenario]
    schedule = loadgen_schedule(cfg.user_conf, cfg.benchmark.loadgen_name(args.scenario), len(dataset))
    cal = calibrate(
        engine, dataset.input_ids, params, args.scenario, ttft_limit, tpot_limit, schedule, args.probe_seconds
    )
    out = cfg.log_dir.parent / "calibration"
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps({**asdict(cal), "summary": cal.summary()}, indent=2) + "\n")
    if cal.target_qps is not None:
        (out / "user.conf").write_text(
            calibrated_user_conf(cfg.user_conf, cfg.benchmark.loadgen_name(args.scenario), cal.target_qps)
        )
    elif (out / "user.conf").exists():
        (out / "user.conf").unlink()
    print(f"calibrate: {cal.summary()}; in {out}")


if __name__ == "__main__":
    main()
