"""How well a saved step-cost model fits the steps of a real LoadGen run: one `harness run` of the
scenario at `--qps` (the committed user.conf with only target_qps changed), every engine step's
terms and time logged, then real / model time by kind of step (prefill only, decode only, mixed),
the run's busy time against the model's, and the time the serving loop spends between steps while
requests wait (answering LoadGen, taking new queries: no step-cost term holds it).

    python -m harness.predict.check_steps --system cpu-demo --scenario Server --qps 9.5 \
        --costs build/predict/cpu-demo/llama3.1-8b/step-costs-*.json --out /tmp/check
"""

import argparse
import statistics
import time
from pathlib import Path

from harness.config import RunConfig
from harness.predict.step_costs import StepCostModel
from sut.engine.profile import step_terms
from systems.benchmarks import BENCHMARKS, with_conf_value
from systems.paths import committed_user_conf
from systems.schema import REPO


def kind(shape: dict) -> str:
    if not shape["prefill_token"]:
        return "decode"
    return "prefill" if not shape["decode_token"] else "mixed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmark", default="llama3.1-8b")
    parser.add_argument("--scenario", default="Server", choices=["Offline", "Server", "Interactive"])
    parser.add_argument("--qps", type=float, help="the Server or Interactive run's target_qps")
    parser.add_argument("--costs", type=Path, required=True, help="a saved step-cost model (build/predict/...)")
    parser.add_argument("--out", type=Path, required=True, help="the run's logs and user.conf go here")
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args()
    from harness import run as harness_run
    from sut.engine.scheduler import Scheduler

    costs = StepCostModel.load(args.costs)
    steps, gaps, record, update = [], [], Scheduler.record_step, Scheduler.update_from_output
    last_end = [None]  # when the last step's update ended with requests still in the scheduler

    def logged(self, batch, seconds):
        if last_end[0] is not None:
            gaps.append(time.perf_counter() - seconds - last_end[0])
        steps.append((step_terms(batch), seconds))
        record(self, batch, seconds)

    def updated(self, *args, **kwargs):
        finished = update(self, *args, **kwargs)
        last_end[0] = time.perf_counter() if self.has_unfinished() else None
        return finished

    # every scheduler of this process, the run's own included
    Scheduler.record_step, Scheduler.update_from_output = logged, updated
    loadgen_model = BENCHMARKS[args.benchmark].loadgen_name(args.scenario)
    committed = committed_user_conf(args.root, args.system, args.benchmark, args.scenario).read_text()
    args.out.mkdir(parents=True, exist_ok=True)
    conf = args.out / "user.conf"
    if args.scenario == "Offline":
        conf.write_text(committed)
    elif args.qps is None:
        parser.error(f"--qps: a {args.scenario} run needs its target_qps")
    else:
        conf.write_text(with_conf_value(committed, loadgen_model, "Server", "target_qps", f"{args.qps:.4f}"))
    cfg = RunConfig.resolve(
        args.system,
        args.benchmark,
        args.scenario,
        "performance",
        args.root,
        user_conf=conf,
        log_dir=args.out / "performance",
    )
    print(harness_run.run(cfg))
    for name in ("prefill", "decode", "mixed"):
        ratios = sorted(t / costs.seconds(s) for s, t in steps if kind(s) == name)
        if ratios:
            print(
                f"{name}: {len(ratios)} steps, real / model median {statistics.median(ratios):.3f}, "
                f"p10 {ratios[len(ratios) // 10]:.3f}, p90 {ratios[9 * len(ratios) // 10]:.3f}"
            )
    real, modelled = sum(t for _, t in steps), sum(costs.seconds(s) for s, _ in steps)
    print(f"busy: {real:.1f} s real, {modelled:.1f} s by the model ({len(steps)} steps)")
    if gaps:
        gaps.sort()
        print(
            f"between steps with requests waiting: {len(gaps)} gaps, median {statistics.median(gaps) * 1e3:.2f} ms, "
            f"p90 {gaps[9 * len(gaps) // 10] * 1e3:.2f} ms, {sum(gaps):.1f} s in all"
        )


if __name__ == "__main__":
    main()
