"""One LoadGen run: a system's engine on a benchmark's dataset in one scenario and mode, logs under
build/logs/<system>/<benchmark>/<Scenario>/<mode>/, and a one-line verdict.

The run owns its folder (compliance/run_folder.py): it takes it before the model loads (a second
run aimed at it is refused), clears an earlier run's files, and marks it complete only when LoadGen
ended, every request was answered without an error and, in accuracy mode, the log was scored. A
run with a failed request, or one that raised or was interrupted, is marked failed and ends with a
non-zero exit status (RunFailed; Ctrl-C: 130), so nothing downstream takes it for a result."""

import dataclasses
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlperf_loadgen as lg
from tqdm import tqdm

from accuracy.datasets.reader import load_dataset
from accuracy.report import check_targets, reference_targets, targets_for
from compliance.audit_config import AUDIT_CONFIGS, read_audit_config
from compliance.loadgen_logs import RUN_RECORD, SPEC_METRICS_FILE, STEPS_FILE, read_detail_log
from compliance.run_folder import RunFolder
from harness.config import MODES, SCENARIOS, HarnessConfigError, RunConfig
from harness.loadgen_sut import EngineSUT, Interrupted, construct_qsl
from systems.schema import REPO

MAX_ERRORS_SHOWN = 10


class RunFailed(RuntimeError):
    """LoadGen finished, but the run is no result (a request failed): `summary` is its verdict line."""

    def __init__(self, summary: str, reason: str):
        super().__init__(reason)
        self.summary = summary


def run(cfg: RunConfig, engine=None) -> str:
    """Run LoadGen; return the summary line. Everything that can be checked is checked before
    LoadGen starts. `engine`: one loaded before (`load_engine`), with the run's engine settings, left
    open for the next run; without it the run loads its own and closes it.

    A submission's runs are one per process (`python -m harness run`). In a process's later runs (the
    report's, harness/run_worker.py) LoadGen logs "Multiple conf files are used. This is not valid
    for official submission.", as it should: they are measurements, not a submission's runs."""
    # The inputs before the folder: a bad dataset must not cost the folder its earlier run.
    dataset = load_dataset(cfg.dataset)
    model = cfg.system.model_for(cfg.benchmark.name)
    check_token_ids(dataset, model)
    check_input_lengths(cfg, dataset)
    if cfg.mode == "accuracy":
        check_scoring(cfg, dataset)
    if engine is not None:
        engine.reset()  # nothing cached, counted or timed from the run before
    folder = RunFolder(cfg.log_dir)
    folder.open(
        {"system": cfg.system.name, "benchmark": cfg.benchmark.name, "scenario": cfg.scenario, "mode": cfg.mode}
    )
    if folder.replaced:
        print(f"harness: {cfg.log_dir} held an earlier run ({folder.replaced}); this run replaces it", flush=True)
    try:
        settings = loadgen_settings(cfg)
        if engine is not None:
            check_room(cfg, engine, dataset)
            summary, failures = _run(cfg, engine, dataset, settings, folder)
        else:
            engine = load_engine(cfg, dataset)
            try:
                summary, failures = _run(cfg, engine, dataset, settings, folder)
            finally:
                engine.close()
    except Interrupted as e:
        folder.fail(str(e))
        raise Interrupted(f"{e}; the run is marked failed in {cfg.log_dir}") from None
    except KeyboardInterrupt:
        folder.fail("interrupted (Ctrl-C) before LoadGen started")
        raise Interrupted(
            f"interrupted (Ctrl-C) before LoadGen started; the run is marked failed in {cfg.log_dir}"
        ) from None
    except BaseException as e:
        folder.fail(f"{type(e).__name__}: {e}")
        raise
    if failures:
        folder.fail(failures)
        raise RunFailed(summary, f"{failures}; the run is marked failed in {cfg.log_dir}")
    folder.complete(summary)
    return summary


def write_steps(path: Path, steps: list) -> None:
    """The run's engine steps, each its terms (sut/engine/profile.py TERMS) and seconds: what
    harness/predict checks its step-cost model against (a real run's steps against the profile's)."""
    from sut.engine.profile import TERMS

    rows = [[*(round(terms[t], 3) for t in TERMS), round(seconds, 7)] for terms, seconds in steps]
    path.write_text(json.dumps({"columns": [*TERMS, "seconds"], "steps": rows}, separators=(",", ":")) + "\n")


def loadgen_settings(cfg: RunConfig) -> lg.TestSettings:
    """LoadGen's settings for the run: mlperf.conf, then the run's user.conf (run's doc)."""
    settings = lg.TestSettings()
    name = cfg.benchmark.loadgen_name(cfg.scenario)
    conf_scenario = "Server" if cfg.scenario == "Interactive" else cfg.scenario
    # Named, not left to LoadGen, which loads it by itself on a process's first FromConfig only.
    if settings.FromConfig("", name, conf_scenario, 0):
        raise HarnessConfigError("LoadGen refused its own mlperf.conf (see its log line above)")
    if settings.FromConfig(str(cfg.user_conf), name, conf_scenario):
        raise HarnessConfigError(f"{cfg.user_conf}: LoadGen refused it (see its log line above)")
    settings.scenario, settings.mode = SCENARIOS[cfg.scenario], MODES[cfg.mode]
    if cfg.log_responses:  # LoadGen reads accuracy_log_probability from an audit config only, not user.conf
        settings.accuracy_log_probability = 1.0
    return settings


def load_engine(cfg: RunConfig, dataset=None):
    """The system's engine with the run's settings, warmed up unless cfg.warmup is off: one engine,
    or with data_parallel_size > 1 a pool of replica processes behind the same interface. With
    `dataset`, its prompts are checked against the engine (check_room) before the warm-up."""
    from sut import make_engine

    engine = make_engine(
        cfg.system.model_for(cfg.benchmark.name), **cfg.system.engine_settings(cfg.scenario, cfg.benchmark.name)
    )
    try:
        if dataset is not None:
            check_room(cfg, engine, dataset)
        if cfg.warmup:  # first-use compilation and packing here, not in the first queries' latency
            print(f"warm-up: {engine.warmup():.1f} s before LoadGen starts", flush=True)
    except BaseException:
        engine.close()
        raise
    return engine


def check_room(cfg: RunConfig, engine, dataset) -> None:
    """Every prompt with room for 2 new tokens in the engine's max_model_len. With token latencies on,
    LoadGen (logging.cc, AsyncLog::RecordSampleCompletion) logs an error_runtime "Number of tokens
    need to be greater than 1" for n_tokens == 1 (and for 0), then records the sample with n_tokens 0,
    so TPOT = (e2e - TTFT) / (0 - 1) is negative rather than a division by zero; the official checker
    fails the accuracy run on that error (its performance check counts LoadGen errors only with
    --submission-exceptions; our audit always does). As in vLLM, min_tokens 1 keeps EOS from being
    the first token, and the response holds the EOS that ends it, so every response has at least 2
    tokens unless only one fits in max_model_len: refused here, before LoadGen starts."""
    no_room = [i for i, ids in enumerate(dataset.input_ids) if engine.max_model_len - len(ids) < 2]
    if no_room:
        raise HarnessConfigError(
            f"{cfg.dataset}: samples {no_room[:5]} leave room for "
            f"fewer than 2 new tokens in max_model_len {engine.max_model_len}; LoadGen logs an "
            "error for a response of fewer than 2 tokens"
        )
    # The rules forbid lowering the maximum output length: in the closed division every prompt keeps
    # room for the benchmark's new tokens of this mode (the engine would clamp them to max_model_len),
    # or for the length a traffic sample gives it.
    new_tokens = cfg.benchmark.max_tokens(cfg.mode)
    wanted = [
        len(ids) + (n or new_tokens)
        for ids, n in zip(dataset.input_ids, dataset.output_tokens or [None] * len(dataset))
    ]
    short = [i for i, total in enumerate(wanted) if total > engine.max_model_len]
    if cfg.system.division == "closed" and short:
        longest = max(len(dataset.input_ids[i]) for i in short)
        raise HarnessConfigError(
            f"{cfg.dataset}: samples {short[:5]} (the longest {longest} tokens) leave room for fewer than "
            f"the {new_tokens} new tokens of {cfg.benchmark.name}'s {cfg.mode} runs in max_model_len "
            f"{engine.max_model_len}: raise max_model_len to at least {max(wanted)} (the rules forbid a "
            "lower maximum output length)"
        )


def check_scoring(cfg: RunConfig, dataset) -> None:
    """Before an accuracy run (gpt-oss-120b's and deepseek-r1's take hours), what its scoring will
    need: each sample's reference text (summarization), or each sample's sub-dataset known to the
    benchmark's script and, where the set has LiveCodeBench samples, LiveCodeBench's problems named
    in the system file."""
    name = cfg.benchmark.name
    if cfg.benchmark.scorer == "summarization":
        if None in dataset.references:
            raise HarnessConfigError(
                f"{cfg.dataset}: sample {dataset.references.index(None)} has no 'output' (the reference "
                f"text), which scoring {name}'s accuracy run needs"
            )
        return
    from accuracy.deepseek_r1 import DeepSeekR1AccuracyError, dataset_subsets
    from accuracy.gpt_oss import GptOssAccuracyError, family_of, load_records

    try:
        if cfg.benchmark.scorer == "deepseek_r1":
            families = dataset_subsets(cfg.dataset)
        else:
            records = load_records(cfg.dataset)
            families = {family_of(r["dataset"], f"{cfg.dataset}: sample {i}")[1] for i, r in enumerate(records)}
    except (GptOssAccuracyError, DeepSeekR1AccuracyError) as e:
        raise HarnessConfigError(str(e)) from None
    problems = cfg.system.accuracy_file(name, "lcb_problems")
    if "livecodebench" in families and (problems is None or not problems.exists()):
        raise HarnessConfigError(
            f"{cfg.dataset}: its LiveCodeBench samples are graded by running each problem's tests, so "
            f"LiveCodeBench's problems (livecodebench/code_generation_lite, test*.jsonl) must be "
            f"named as saaf_harness.datasets.{name}.lcb_problems"
            + (f"; {problems} does not exist" if problems is not None else "")
        )


def check_input_lengths(cfg: RunConfig, dataset) -> None:
    """Every prompt within the benchmark's maximum input length, where it sets one (deepseek-r1:
    3136 tokens a question and the reference's allowance of 4 for the chat template around it)."""
    benchmark = cfg.benchmark
    if benchmark.max_prompt_tokens is None:
        return
    longest = max(range(len(dataset)), key=lambda i: len(dataset.input_ids[i]))
    if len(dataset.input_ids[longest]) > benchmark.max_prompt_tokens:
        raise HarnessConfigError(
            f"{dataset.path}: sample {longest} is {len(dataset.input_ids[longest])} tokens, over "
            f"{benchmark.name}'s maximum input length ({benchmark.max_input_tokens} tokens and "
            f"{benchmark.chat_template_tokens} for the chat template)"
        )


def check_token_ids(dataset, model) -> None:
    """Every prompt's token ids within the model's vocabulary, before the model loads: an id outside
    it would fail its request in the middle of the run."""
    import numpy as np

    from sut.config import ModelConfig

    vocab = ModelConfig.from_folder(model).vocab_size
    for i, ids in enumerate(dataset.input_ids):
        high = int(np.max(ids))
        if high >= vocab:
            raise HarnessConfigError(
                f"{dataset.path}: sample {i} has token id {high}, outside the vocabulary "
                f"[0, {vocab}) of the model {model}: the dataset was tokenized for another model"
            )


def sampling_params(cfg: RunConfig, dataset):
    """The benchmark's generation settings for the run's mode (systems/benchmarks.py generation: the
    reference SUT's), one for all samples; or one per sample (QSL index) where the benchmark samples,
    each seeded with its QSL index, so that a sample draws the same tokens in every run and whatever
    else is in its batch; or where a traffic sample gives each response's length (each generated that
    long, at least 2: _run says why)."""
    from sut import SamplingParams

    params = SamplingParams(**cfg.benchmark.generation(cfg.mode))
    if dataset.output_tokens is None and params.greedy:
        return params
    per_sample = [params if params.greedy else dataclasses.replace(params, seed=i) for i in range(len(dataset))]
    if dataset.output_tokens is None:
        return per_sample
    return [
        p if n is None else dataclasses.replace(p, max_tokens=max(2, n), min_tokens=max(2, n), ignore_eos=True)
        for p, n in zip(per_sample, dataset.output_tokens)
    ]


def _run(cfg: RunConfig, engine, dataset, settings: lg.TestSettings, folder: RunFolder) -> tuple[str, str | None]:
    # The reference SUT's settings (language/llama3.1-8b/SUT_VLLM.py: max_tokens 128, min_tokens 1;
    # language/gpt-oss-120b: temperature 1, top_p 1, 10240 new tokens, 32768 in accuracy runs).
    params = sampling_params(cfg, dataset)
    shutil.copyfile(cfg.user_conf, cfg.log_dir / "user.conf")  # what this run was given (the packager takes it)
    if engine.device.type == "cpu":
        from sut import machine_description

        (cfg.log_dir / "machine.txt").write_text(machine_description() + "\n")
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(cfg.log_dir)
    log_settings.log_output.copy_summary_to_stdout = False
    bar = tqdm(desc=f"{cfg.scenario} {cfg.mode}", unit="sample")
    sut = EngineSUT(
        engine,
        dataset.input_ids,
        params,
        stream_first_token=cfg.scenario != "Offline",
        on_complete=lambda out: bar.update(1),
        on_fatal=lambda error: _abandon(engine, error, folder),
    )
    if unique_issue(cfg.mode):
        # Each sample of the set issued once: LoadGen's query is performance_sample_count samples
        # (test_settings_internal.cc), and 6.0.17 crashes in StartTest when that is larger than the
        # QSL (mlperf.conf's 6396 on TEST07's 990-sample set), so it is the set's own size.
        settings.performance_sample_count_override = len(dataset)
    performance_count = min(len(dataset), settings.performance_sample_count_override or len(dataset))
    qsl = construct_qsl(len(dataset), performance_count)
    # LoadGen applies an audit config over both conf files; a path nobody has means no audit.
    audit_config = str(AUDIT_CONFIGS[cfg.mode] if cfg.mode in AUDIT_CONFIGS else cfg.log_dir / "no-audit.config")
    scheduler = getattr(engine, "scheduler", None)  # one engine's (a pool's steps are in its processes)
    if scheduler is not None:
        scheduler.step_log = []
    try:
        sut.run_test(qsl, settings, log_settings, audit_config)
    finally:
        if not sut.loadgen_running:  # interrupted: LoadGen's test still runs, and the process ends
            lg.DestroyQSL(qsl)
        sut.close()
        bar.close()
    for error in sut.errors[:MAX_ERRORS_SHOWN]:
        print(f"failed request: {error}")
    if len(sut.errors) > MAX_ERRORS_SHOWN:
        print(f"failed request: ... and {len(sut.errors) - MAX_ERRORS_SHOWN} more")
    failures = f"{len(sut.errors)} of {sut.issued} requests failed (the first: {sut.errors[0]})" if sut.errors else None
    write_run_record(cfg, engine, len(dataset))
    if scheduler is not None:
        write_steps(cfg.log_dir / STEPS_FILE, scheduler.step_log)
        scheduler.step_log = None
    spec = engine.spec_stats()
    speculation = ""
    if spec is not None:  # beside LoadGen's logs; the packager names the proposer in the sw_notes
        (cfg.log_dir / SPEC_METRICS_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        speculation = (
            f"; speculation ({spec['description']}): acceptance {spec['acceptance_rate'] or 0:.3f}, "
            f"mean accepted length {spec['mean_accepted_length'] or 1:.2f}"
        )
    errors = f"{len(sut.errors)} of {sut.issued} requests failed" if sut.errors else "no errors"
    if cfg.mode == "accuracy":
        result, scores = score(cfg, dataset)
        reference = cfg.system.accuracy_reference
        targets = (
            reference_targets(json.loads(reference.read_text())["scores"], cfg.benchmark.name)
            if reference
            else targets_for(cfg.benchmark.name)
        )
        misses = check_targets(targets, result) + ([errors] if sut.errors else [])
        verdict = "PASS" if not misses else "FAIL (" + "; ".join(misses) + ")"
        return (f"{cfg.scenario} accuracy: {verdict}: {scores}; {errors}{speculation}; logs in {cfg.log_dir}", failures)
    detail, _ = read_detail_log(cfg.log_dir / "mlperf_log_detail.txt")
    tokens_per_s = detail.get("result_tokens_per_second", detail.get("result_completed_tokens_per_second", 0.0))
    ttft = detail.get("result_first_token_99.00_percentile_latency_ns")
    tpot = detail.get("result_time_per_output_token_99.00_percentile_ns")
    latency = ""
    if ttft is not None and tpot is not None and cfg.scenario != "Offline":
        latency = f", p99 TTFT {ttft / 1e6:.0f} ms, p99 TPOT {tpot / 1e6:.1f} ms"
    verdict = validity(detail, cfg.mode)
    if sut.errors:  # LoadGen counts an error response as any other: its VALID is no result
        verdict = f"FAILED ({errors}; LoadGen said {verdict})"
    return (
        f"{cfg.scenario} {cfg.mode}: {verdict}, {tokens_per_s:.1f} tokens/s{latency}; {errors}{speculation}; "
        f"logs in {cfg.log_dir}",
        failures,
    )


def score(cfg: RunConfig, dataset) -> tuple[dict, str]:
    """Score the run's accuracy log with the benchmark's accuracy script into accuracy.txt; return
    (its result, the scores in words)."""
    log, out = cfg.log_dir / "mlperf_log_accuracy.json", cfg.log_dir / "accuracy.txt"
    if cfg.benchmark.scorer == "gpt_oss":
        lcb = cfg.system.accuracy_file(cfg.benchmark.name, "lcb_problems")
        result = score_gpt_oss(log, cfg.dataset, cfg.system.model_for(cfg.benchmark.name), out, lcb)
        names = ("exact_match", "tokens_per_sample")
    elif cfg.benchmark.scorer == "deepseek_r1":
        # what `python -m accuracy.deepseek_r1 --mlperf-accuracy-file LOG --dataset D --tokenizer M
        # --output-file accuracy.txt` writes: its report, ending as the reference prints its result
        from accuracy.deepseek_r1 import write_accuracy_txt

        lcb = cfg.system.accuracy_file(cfg.benchmark.name, "lcb_problems")
        model = cfg.system.model_for(cfg.benchmark.name)
        result = write_accuracy_txt(log, cfg.dataset, model, out, lcb_problems=lcb)
        names = ("exact_match", "tokens_per_sample")
    else:
        from accuracy.evaluate import evaluate_summarization

        result = evaluate_summarization(log, dataset.references, cfg.tokenizer, out)
        names = ("rouge1", "rouge2", "rougeL", "rougeLsum", "tokens_per_sample")
    return result, ", ".join(f"{k} {result[k]}" for k in names)


def score_gpt_oss(log: Path, dataset: Path, model: Path, out: Path, lcb_problems: Path | None = None) -> dict:
    """Score a gpt-oss-120b accuracy log with its script, accuracy.gpt_oss (what `python -m
    accuracy.gpt_oss --mlperf-accuracy-file LOG --dataset D --tokenizer M` prints: special tokens
    kept, the harmony final channel graded per sub-dataset, the score weighted by repeats), and write
    accuracy.txt: that report, whose last line is `'exact_match': N` as the reference prints it, then
    `{'exact_match': ..., 'tokens_per_sample': ..., 'gen_num': ...}` (plain numbers, for the checker's
    patterns; gen_num the samples scored, one per qsl_idx) and the `hash=` line of the log scored."""
    from accuracy.gpt_oss import evaluate, format_report

    data = Path(log).read_bytes()
    result = evaluate(log, dataset, model, lcb_problems=lcb_problems)
    summary = {
        "exact_match": round(float(result["exact_match"]), 3),
        "tokens_per_sample": round(float(result["tokens_per_sample"] or 0.0), 1),
        "gen_num": int(result["total_samples"]),
    }
    out.write_text(format_report(result) + f"\n\n{summary}\nhash={hashlib.sha256(data).hexdigest()}\n")
    return {**result, **summary}


def write_run_record(cfg: RunConfig, engine, num_samples: int) -> None:
    """RUN_RECORD beside LoadGen's logs: the conditions of the run (what the report prints beside its
    numbers) and the engine's busy time split between prefill and decode (its cost split)."""
    from sut import machine_description

    record = {
        "system": cfg.system.name,
        "benchmark": cfg.benchmark.name,
        "scenario": cfg.scenario,
        "mode": cfg.mode,
        "model": str(cfg.system.model_for(cfg.benchmark.name)),
        "model_name": cfg.system.model_name,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "engine": cfg.system.engine_settings(cfg.scenario, cfg.benchmark.name),
        "max_model_len": engine.max_model_len,
        "dataset": str(cfg.dataset),  # the packager's TEST07 command scores on it (compliance/test07.py)
        "dataset_samples": num_samples,
        "machine": machine_description(),
        "commit": code_commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "busy_s": engine.busy_stats(),
    }
    if hasattr(engine, "transfer_stats"):  # disaggregated serving's KV transfers (sut/engine/disaggregated.py)
        record["kv_transfer"] = engine.transfer_stats()
    (cfg.log_dir / RUN_RECORD).write_text(json.dumps(record, indent=2) + "\n")


def code_commit() -> str:
    """The repository's commit, `-dirty` where the working tree has changes; `unknown` without git."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def _abandon(engine, error: Exception, folder: RunFolder) -> None:
    """A replica died: what was in flight has been answered; end the run now, with the error, rather
    than answer LoadGen's remaining schedule with errors for minutes. LoadGen's thread cannot be
    stopped, so the process exits, after stopping the other replicas (none is left behind) and
    marking the run failed."""
    print(f"\nerror: harness: {error}; the run is abandoned", file=sys.stderr, flush=True)
    folder.fail(f"abandoned: {error}")
    engine.close()
    os._exit(3)


def unique_issue(mode: str) -> bool:
    """Whether a mode's audit config issues each sample once (TEST07, TEST09)."""
    return mode in AUDIT_CONFIGS and read_audit_config(AUDIT_CONFIGS[mode]).get("performance_issue_unique") == "1"


def validity(detail: dict, mode: str) -> str:
    """LoadGen's verdict, saying so where a compliance run (min_duration 0) fails early stopping
    alone: TEST06's 100 queries are too few for it at p99 (it needs ~460), and TEST07/TEST09 issue
    each sample of a set once; each test checks the responses (compliance/test06.py, test07.py,
    test09.py), not this verdict, as the official checker does."""
    verdict = detail.get("result_validity", "INVALID")
    met = ("result_perf_constraints_met", "result_min_duration_met", "result_min_queries_met")
    if (
        mode in AUDIT_CONFIGS
        and verdict == "INVALID"
        and not detail.get("early_stopping_met")
        and all(map(detail.get, met))
    ):
        return f"INVALID by early stopping alone ({detail.get('result_query_count')} queries; not a {mode} criterion)"
    return verdict
