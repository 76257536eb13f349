"""gpt-oss-120b end to end on a tiny gpt-oss, as `make submission` runs it: an open-division system
(`tiny-gpt-oss`, its model substituted) runs performance, accuracy, TEST07 and TEST09 in Offline and
in Server through `python -m harness run` (LoadGen, the engine sampling at temperature 1 as the
reference does), each mode on its own parquet set; the packager builds the tree and our checker
passes it.

The model is a GptOssForCausalLM of 2 layers whose attention and experts are random at their usual
scale, but whose embeddings and LM head are set so that it follows known token chains: a GPQA
prompt's last token leads to a letter and <|return|>, an AIME prompt's to "answer: N" and <|return|>,
a TEST09 prompt's to a path of as many tokens as the prompt's last token says (1200 to 1350).
Its logits put the next token of a chain 100 or more above any other, so sampling at temperature 1
draws it (checked with transformers). So the official thresholds hold for what it does:
TEST07's 60.698 (7 of its 10 GPQA answers agree with the set's ground truth) and TEST09's mean length
in [1150.38, 1406.02]; a harness that dropped, cut or reordered tokens would miss them. Its accuracy
targets are those of a substituted model (the demo's way): the benchmark's shares of what its
transformers reference run scores on the same accuracy set (99% of exact_match 79, tokens_per_sample
at most 110%). The performance set is the tiny system's own, of one-letter answers, so that
Server's VALID run (early stopping: some 480 queries) takes seconds; TEST09 runs on the set of long
paths, as the reference's TEST09 runs on its performance set."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from compliance.check import Report, check_scenario, check_tree
from compliance.package import package
from systems.benchmarks import BENCHMARKS
from tests.test_gpt_oss import yarn
from tests.tiny_system import reseal, run_and_package, write_system

SYSTEM = "tiny-gpt-oss"
HARMONY = ["<|endoftext|>", "<|return|>", "<|call|>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>"]
EOS = ["<|return|>", "<|endoftext|>", "<|call|>"]  # gpt-oss-120b's generation_config order
LETTERS = ["A", "B", "C", "D"]
VARIANTS = ["Answer:", "answer:", "ANSWER:", "aNSWER:"]  # one per AIME sample: a chain carries no memory
NUMBERS = ["70", "204", "12", "33"]
WORDS = ["system", "user", "assistant", "Reasoning:", "low", "high", "Summarize:", "Question:"]
FILLERS = [f"x{i}" for i in range(24)]
GPQA = [f"q{i}" for i in range(10)]  # a GPQA prompt's last token
AIME = [f"a{i}" for i in range(len(NUMBERS))]  # an AIME prompt's
PATH_LENGTH = 1500
PATH = [f"w{i}" for i in range(PATH_LENGTH)]  # a performance prompt's last token starts a path
VOCAB = HARMONY + WORDS + LETTERS + VARIANTS + NUMBERS + FILLERS + GPQA + AIME + PATH
ID = {token: i for i, token in enumerate(VOCAB)}
PERF_LENGTHS = [1200, 1280, 1350]  # response lengths (the <|return|> included): mean 1276.67
ANSWERS = {q: LETTERS[(3 * k + 1) % 4] for k, q in enumerate(GPQA)}
# Ground truth of the accuracy set's GPQA samples (2 of 10 disagree with the model) and AIME
# samples (1 of 4), and of TEST07's set (3 of 10): exact_match 79.0 and 70.0.
ACC_GPQA_TRUTH = [ANSWERS[q] if k not in (2, 7) else "D" if ANSWERS[q] != "D" else "A" for k, q in enumerate(GPQA)]
ACC_AIME_TRUTH = [n if k != 3 else "999" for k, n in enumerate(NUMBERS)]
TEST07_TRUTH = [ANSWERS[q] if k not in (1, 4, 8) else "D" if ANSWERS[q] != "D" else "A" for k, q in enumerate(GPQA)]
USER_CONF = """\
gpt-oss-120b.Offline.target_qps = 100
gpt-oss-120b.Offline.min_duration = 0
gpt-oss-120b.Offline.min_query_count = 8
gpt-oss-120b.Offline.performance_sample_count_override = 8
gpt-oss-120b.Offline.accuracy_sample_count_override = 14
gpt-oss-120b.Server.target_qps = 100
gpt-oss-120b.Server.min_duration = 1000
gpt-oss-120b.Server.min_query_count = 480
gpt-oss-120b.Server.performance_sample_count_override = 8
gpt-oss-120b.Server.accuracy_sample_count_override = 14
"""
SCENARIOS = ("Offline", "Server")
MODES = ("performance", "accuracy", "TEST07", "TEST09")


def chains() -> dict[int, int]:
    """token id -> the next token id the model is built to give after it."""
    following = {L: "<|return|>" for L in LETTERS} | {PATH[-1]: "<|return|>"} | dict(ANSWERS)
    for a, v, n in zip(AIME, VARIANTS, NUMBERS):
        following |= {a: v, v: n, n: "<|return|>"}
    following |= dict(zip(PATH, PATH[1:]))
    return {ID[a]: ID[b] for a, b in following.items()}


def continuation(prompt: list[int]) -> list[int]:
    """The response the model is built to give: the chain from the prompt's last token, to <|return|>."""
    step, out = chains(), [chains()[prompt[-1]]]
    while out[-1] != ID["<|return|>"]:
        out.append(step[out[-1]])
    return out


def build_model(folder: Path):
    """The tiny gpt-oss (see the module docstring) and its word-level tokenizer with the harmony
    tokens, saved as a Hugging Face folder; returns the transformers model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GptOssConfig, GptOssForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = GptOssConfig(
        vocab_size=len(VOCAB),
        hidden_size=256,
        intermediate_size=128,
        head_dim=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
        max_position_embeddings=2048,
        rope_parameters=yarn(64),
        eos_token_id=[ID[t] for t in EOS],
        pad_token_id=ID["<|endoftext|>"],
        bos_token_id=ID["<|start|>"],
    )
    model = GptOssForCausalLM(config).to(torch.float32).eval()
    embed = torch.randn(len(VOCAB), config.hidden_size)
    head = torch.zeros(len(VOCAB), config.hidden_size)
    for token, following in chains().items():  # the next token's row points along the token's embedding
        head[following] += embed[token]
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(head)
    model.save_pretrained(folder)
    words = Tokenizer(models.WordLevel(ID, unk_token="<|endoftext|>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=words, additional_special_tokens=HARMONY, eos_token="<|return|>", pad_token="<|endoftext|>"
    ).save_pretrained(folder)
    return model


def harmony_prompt(*words: str, effort: str = "high") -> list[int]:
    tokens = ["<|start|>", "system", "Reasoning:", effort, "<|end|>", "<|start|>", "user", *words]
    return [ID[t] for t in (*tokens[:-1], "<|end|>", "<|start|>", "assistant", tokens[-1])]


def write_set(path: Path, prompts: list[list[int]], names: list[str], truths: list) -> Path:
    """A parquet set with the reference's columns."""
    import pandas as pd

    text = [" ".join(VOCAB[t] for t in p) for p in prompts]
    frame = pd.DataFrame(
        {
            "input_tokens": prompts,
            "num_tokens": [len(p) for p in prompts],
            "text_input": text,
            "ground_truth": truths,
            "dataset": names,
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path)
    return path


def reference_run(model, model_dir: Path, prompts: list[list[int]], dataset: Path) -> dict:
    """The transformers implementation on the accuracy set, sampled as the reference samples
    (temperature 1, top_p 1, no top-k), scored with the benchmark's script: the substituted model's
    reference scores."""
    from transformers import AutoTokenizer

    from accuracy.gpt_oss import load_records, score

    outputs = []
    torch.manual_seed(0)
    with torch.no_grad():
        for prompt in prompts:
            ids = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=64,
            )
            outputs.append(ids[0, len(prompt) :].tolist())
    texts = AutoTokenizer.from_pretrained(model_dir).batch_decode(outputs, skip_special_tokens=False)
    result = score(dict(enumerate(texts)), load_records(dataset), tokens_by_qsl=dict(enumerate(map(len, outputs))))
    return {"outputs": outputs, "exact_match": result["exact_match"], "tokens_per_sample": result["tokens_per_sample"]}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """(root, tree, prompts by set, the reference run, each mode's verdict line, the transformers model)."""
    root = tmp_path_factory.mktemp("gpt-oss-repo")
    model_dir = root / "models" / SYSTEM
    model = build_model(model_dir)
    prompts = {
        "performance": [harmony_prompt("Summarize:", f"x{i + 12}", GPQA[i], effort="low") for i in range(8)],
        "TEST09": [
            harmony_prompt("Summarize:", f"x{i}", PATH[PATH_LENGTH - n], effort="low")
            for i, n in enumerate(PERF_LENGTHS)
        ],
        "accuracy": [harmony_prompt("Question:", f"x{k}", q) for k, q in enumerate(GPQA)]
        + [harmony_prompt("Question:", f"x{k + 10}", a) for k, a in enumerate(AIME)],
        "TEST07": [harmony_prompt("Question:", f"x{k + 5}", q) for k, q in enumerate(GPQA)],
    }
    data = root / "data" / "gpt-oss"
    sets = {
        "performance": write_set(
            data / "perf" / "perf_eval_short.parquet", prompts["performance"], ["pubmed_summarization"] * 8, [None] * 8
        ),
        "TEST09": write_set(
            data / "perf" / "perf_eval_ref.parquet", prompts["TEST09"], ["pubmed_summarization"] * 3, [None] * 3
        ),
        "accuracy": write_set(
            data / "acc" / "acc_eval_inputs.parquet",
            prompts["accuracy"],
            ["gpqa_diamond"] * 10 + ["aime25"] * 4,
            ACC_GPQA_TRUTH + ACC_AIME_TRUTH,
        ),
        "TEST07": write_set(
            data / "acc" / "acc_eval_compliance_gpqa.parquet", prompts["TEST07"], ["gpqa_diamond"] * 10, TEST07_TRUTH
        ),
    }
    reference = reference_run(model, model_dir, prompts["accuracy"], sets["accuracy"])
    reference_file = root / "reference.json"
    reference_file.write_text(
        json.dumps(
            {
                "model": SYSTEM,
                "implementation": "transformers generate, float32, temperature 1, top_p 1",
                "dataset_sha256": hashlib.sha256(sets["accuracy"].read_bytes()).hexdigest(),
                "scores": {k: reference[k] for k in ("exact_match", "tokens_per_sample")},
                "eos_token_ids": [ID[t] for t in EOS],
            }
        )
    )
    write_system(
        root, model_dir, sets, reference_file, benchmark="gpt-oss-120b", name=SYSTEM, model_name=SYSTEM,
        scenarios=SCENARIOS, user_conf=USER_CONF,
    )  # fmt: skip
    tree, verdicts = run_and_package(root, SYSTEM, "gpt-oss-120b", SCENARIOS, MODES)
    return root, tree, prompts, reference, verdicts, model


def logs(root: Path, mode: str, scenario: str = "Offline") -> Path:
    return root / "build" / "logs" / SYSTEM / "gpt-oss-120b" / scenario / mode


def responses(log: Path) -> dict[int, list[int]]:
    """qsl_idx -> the int32 token ids of a LoadGen accuracy log."""
    entries = json.loads(log.read_text())
    return {e["qsl_idx"]: list(memoryview(bytes.fromhex(e["data"])).cast("i")) for e in entries}


@pytest.mark.slow
def test_the_model_follows_its_chains_with_margins_that_make_sampling_exact(chain):
    """The premise, with transformers: after every token of every designed response the next one
    leads the logits by more than 50 (so temperature 1 draws another with probability below
    vocabulary x e^-50 a token); and the reference run sampled exactly the designed responses."""
    _, _, prompts, reference, _, model = chain
    for prompt in (prompts["performance"][-1], *prompts["accuracy"]):
        sequence = prompt + continuation(prompt)
        with torch.no_grad():
            logits = model(torch.tensor([sequence])).logits[0, len(prompt) - 1 : -1]
        top = logits.topk(2, dim=-1)
        assert top.indices[:, 0].tolist() == sequence[len(prompt) :]
        assert (top.values[:, 0] - top.values[:, 1]).min() > 50
    assert reference["outputs"] == [continuation(p) for p in prompts["accuracy"]]
    assert reference["exact_match"] == pytest.approx(79.0) and reference["tokens_per_sample"] == pytest.approx(32 / 14)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_mode_runs_on_its_own_set_and_answers_as_the_model_does(chain, scenario):
    root, _, prompts, _, verdicts, _ = chain
    assert verdicts[scenario, "performance"].startswith(f"{scenario} performance: VALID"), verdicts
    assert verdicts[scenario, "accuracy"].startswith(
        f"{scenario} accuracy: PASS: exact_match 79.0, tokens_per_sample 2.3"
    ), verdicts
    for mode, name in (
        ("performance", "perf_eval_short"),
        ("accuracy", "acc_eval_inputs"),
        ("TEST07", "acc_eval_compliance_gpqa"),
        ("TEST09", "perf_eval_ref"),
    ):
        record = json.loads((logs(root, mode, scenario) / "run.json").read_text())
        assert Path(record["dataset"]).name == f"{name}.parquet" and record["model"].endswith(SYSTEM)
    # The responses, through LoadGen, are the designed ones, sampled at temperature 1 (seeded per
    # sample): the GPQA letters, the AIME answers, TEST09's paths of 1200-1350 tokens.
    for mode in ("accuracy", "TEST07", "TEST09"):
        got = responses(logs(root, mode, scenario) / "mlperf_log_accuracy.json")
        assert got == {i: continuation(p) for i, p in enumerate(prompts[mode])}
    test09 = responses(logs(root, "TEST09", scenario) / "mlperf_log_accuracy.json")
    assert [len(r) for _, r in sorted(test09.items())] == PERF_LENGTHS


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_test07_and_test09_run_under_the_official_audit_settings_and_pass(chain, scenario):
    root, tree, _, _, verdicts, _ = chain
    results = tree / "open" / "TestOrg" / "results" / SYSTEM / SYSTEM / scenario
    verify07 = (results / "TEST07" / "verify_accuracy.txt").read_text()
    assert "'exact_match': 70.000" in verify07 and "Accuracy check pass: True" in verify07
    assert verify07.rstrip().endswith("TEST PASS")
    verify09 = (results / "TEST09" / "verify_output_len.txt").read_text()
    assert "Mean output tokens: 1276.67" in verify09 and verify09.rstrip().endswith("TEST PASS")
    detail = (logs(root, "TEST07", scenario) / "mlperf_log_detail.txt").read_text()
    # The 10-sample set issued once with performance_issue_unique: the override is the set's size.
    assert '"key": "effective_performance_sample_count", "value": 10' in detail
    assert '"key": "effective_performance_issue_unique", "value": true' in detail
    accuracy = (logs(root, "accuracy", scenario) / "accuracy.txt").read_text()
    assert "'exact_match': 79.000" in accuracy and "'tokens_per_sample': 2.3, 'gen_num': 14}" in accuracy


def test_the_tree_passes_the_checker(chain):
    _, tree, _, _, _, _ = chain
    report = check_tree(tree, demo=True)
    bench = tree / "open" / "TestOrg" / "results" / SYSTEM / SYSTEM
    assert report.errors == []
    # What the demo knowingly shortens: 8 of 6396 performance samples, 14 of the 4395 accuracy
    # samples, 10 of TEST07's 990, 3 of TEST09's, and the minimum duration.
    assert all(
        any(f"[{rule}]" in w for rule in ("min-duration", "sample-count", "dataset-size", "TEST07", "TEST09"))
        for w in report.warnings
    ), report.warnings
    assert any("effective_accuracy_sample_count 14 is not the dataset size 4395" in w for w in report.warnings)
    assert any("logs 10 distinct samples, not the compliance set's 990" in w for w in report.warnings)
    # Each scenario's folder alone, against the substituted model's targets: nothing fails.
    reference = json.loads((tree / "open/TestOrg/documentation" / f"{SYSTEM}_reference_accuracy.json").read_text())
    from accuracy.report import reference_targets

    for scenario in SCENARIOS:
        alone = Report(demo=True)
        targets = reference_targets(reference["scores"], "gpt-oss-120b")
        check_scenario(bench / scenario, BENCHMARKS["gpt-oss-120b"], targets, alone)
        assert alone.errors == [], scenario
    mapping = json.loads((tree / "open/TestOrg/model_mapping.json").read_text())
    assert mapping == {SYSTEM: "gpt-oss-120b"}


@pytest.mark.slow
def test_a_harness_that_cut_responses_fails_test09_by_name(chain, tmp_path):
    """A planted defect at chain level: TEST09's responses cut by 200 tokens each (n_tokens left as
    reported) fail its bounds and its length check, in the packager and in the checker."""
    root, _, _, _, _, _ = chain
    copy = tmp_path / "repo"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("submission"))
    log = logs(copy, "TEST09") / "mlperf_log_accuracy.json"
    entries = json.loads(log.read_text())
    for entry in entries:
        entry["data"] = entry["data"][: -200 * 8]
    log.write_text(json.dumps(entries))
    reseal(logs(copy, "TEST09"))
    _, failures = package(SYSTEM, copy / "submission", root=copy)
    assert any("TEST09: the mean output length 1076.67 tokens over 3 responses is outside" in f for f in failures)
    errors = check_tree(copy / "submission", demo=True).errors
    assert any("[TEST09] the mean output length, counted from the logged responses, is 1076.67" in e for e in errors)
    assert any("[TEST09] entry 0 (qsl_idx" in e and "n_tokens was" in e for e in errors)
