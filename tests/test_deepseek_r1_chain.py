"""deepseek-r1 end to end on a tiny DeepSeek-V3, as `make submission` runs it: a hand-built pickle in
the reference's form (text_input, ground_truth, dataset, question) is tokenized with the model's chat
template by `python -m accuracy.datasets.deepseek_r1 convert`'s code; an open-division system
(`tiny-deepseek-r1`, its model substituted) runs performance, accuracy and TEST06 in Offline and in
Server through `python -m harness run` (LoadGen, greedy, the registry's 20000 new tokens); the
packager builds the tree and our checker passes it.

The model is a DeepseekV3ForCausalLM of 3 layers (MLA with the query bottleneck, a dense first layer,
group-routed experts after it) whose weights are random at their usual scale except for three parts
set so that its greedy responses are known texts:
- the embeddings: each token its own hidden dimension, and one dimension every token shares (at 4,
  as the marker's dimensions below: what the random parts add to the residual then moves the logits
  by little);
- the first layer's attention, head 0: a constant query (from the shared dimension) whose score is
  40 on a prompt's marker token `qK` and 0 on every other token, and a value that copies which marker
  it is, through the latent (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj), into a dimension of the
  residual per marker (o_proj). So every position after the marker knows the sample, from the latent
  KV cache: the chat template ends every prompt with the same `<｜Assistant｜><think>`, so nothing
  else could tell the samples apart;
- the LM head: the marker's dimension points to the sample's first response token, and each response
  token's own dimension (twice as strongly) to the token after it, the last to EOS (id 1, as
  DeepSeek-R1's <｜end▁of▁sentence｜>). The next token leads the logits by more than 50 (checked
  with transformers).
The prompts are 5 to 24 tokens (prefilled with the latent attention absorbed and decompressed both).
The responses (SAMPLES) answer GPQA and MMLU-Pro with stated letters (a decoy before the last,
a lone letter, none at all), MATH-500 with \\boxed{} answers graded by equivalence (1/2 as
\\frac{1}{2} and 0.5), AIME with \\boxed{} and "Answer: N" (a ground truth that the pickle holds as
204.0, another as "033"): 11 of 16 right, exact_match 68.75, and 90 tokens in all, tokens_per_sample
5.625. Its accuracy targets are those of a substituted model: the benchmark's shares of what its
transformers reference run scores on the same set. Two planted defects are caught: a TEST06 response
ending in two EOS tokens (the packager and the checker name it), and an accuracy log whose responses
each lost their answer token, scored again (the checker fails both accuracy targets)."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from compliance.check import check_tree
from compliance.package import package
from systems.benchmarks import BENCHMARKS
from tests.helpers import hf_greedy
from tests.test_deepseek_v3 import tiny_deepseek
from tests.tiny_system import reseal, run_and_package, write_system

SYSTEM = "tiny-deepseek-r1"
BENCHMARK = BENCHMARKS["deepseek-r1"]
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"  # ids 0 and 1, as in DeepSeek-R1's tokenizer
USER, ASSISTANT, THINK = "<｜User｜>", "<｜Assistant｜>", "<think>"
# DeepSeek-R1's chat template for one user turn with the assistant's opened, less its "\n" after
# <think>, which a whitespace tokenizer drops: 4 tokens around the question (MAX_TEMPLATE_TOKS).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}<｜User｜>"
    "{{ message['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜><think>{% endif %}"
)
PROMPT_WORDS = "Which of these is right ? Compute the value and put your final answer last .".split()
# (dataset, ground truth as the pickle holds it, the response, whether the script grades it right)
SAMPLES = [
    ("gpqa", "C", "r0.0 r0.1 r0.2 ANSWER: C", True),
    ("gpqa", "B", "r1.0 Answer: (A) r1.1 r1.2 r1.3 FINAL ANSWER= B", True),  # the last stated answer counts
    ("gpqa", "D", "r2.0 r2.1 answer: A", False),
    ("gpqa", "A", " ".join(f"r3.{j}" for j in range(12)), False),  # no answer at all
    ("gpqa", "D", "r4.0 answer= D", True),
    ("mmlu_pro", "J", "r5.0 r5.1 ANSWER J", True),
    ("mmlu_pro", "H", "r6.0 r6.1 H r6.2", True),  # no stated answer: the last lone letter A-J
    ("mmlu_pro", "E", "r7.0 Answer= F", False),
    ("math500", "1/2", "r8.0 r8.1 \\boxed{\\frac{1}{2}}", True),
    ("math500", "\\frac{1}{2}", "r9.0 \\boxed{3} r9.1 r9.2 \\boxed{0.5}", True),  # the last \boxed{}
    ("math500", "2", "r10.0 \\boxed{4}", False),
    ("math500", "x^2+1", " ".join(f"r11.{j}" for j in range(7)) + " \\boxed{x^2+1}", True),
    ("aime", 42, "r12.0 \\boxed{42}", True),
    ("aime", 204.0, "r13.0 r13.1 ANSWer: 204", True),  # "Answer: N" where nothing is boxed
    ("aime", 70, "r14.0 \\boxed{7}", False),
    ("aime", "033", "r15.0 r15.1 r15.2 \\boxed{33}", True),
]
EXACT_MATCH = 68.75  # 11 of 16
TOKENS_PER_SAMPLE = 5.625  # 90 response tokens (each response's EOS included) over 16 samples
MARKERS = [f"q{k}" for k in range(len(SAMPLES))]
RESPONSE_WORDS = [w for _, _, text, _ in SAMPLES for w in text.split()]
VOCAB = list(dict.fromkeys([BOS, EOS, USER, ASSISTANT, THINK, *PROMPT_WORDS, *MARKERS, *RESPONSE_WORDS]))
ID = {token: i for i, token in enumerate(VOCAB)}
HIDDEN = 192
SHARED = len(VOCAB)  # the hidden dimension every token's embedding has, after one per token
CONTEXT = SHARED + 1  # then one per marker, which the first layer's attention writes
MARKER_SCORE = 40.0  # head 0's attention score on a marker (0 on every other token)
STEP = 10.0  # the LM head's weight from a marker to its first token (2 x STEP from a token to its next)
SCALE = 4.0  # the residual's designed parts (embeddings, the markers' dimensions), against the random parts
USER_CONF = """\
deepseek-r1.Offline.target_qps = 100
deepseek-r1.Offline.min_duration = 0
deepseek-r1.Offline.min_query_count = 16
deepseek-r1.Offline.performance_sample_count_override = 16
deepseek-r1.Server.target_qps = 100
deepseek-r1.Server.min_duration = 1000
deepseek-r1.Server.min_query_count = 480
deepseek-r1.Server.performance_sample_count_override = 16
"""
SCENARIOS = ("Offline", "Server")
MODES = ("performance", "accuracy", "TEST06")


def designed(k: int) -> list[int]:
    """Sample k's response as the model is built to give it, EOS included."""
    return [ID[w] for w in SAMPLES[k][2].split()] + [ID[EOS]]


def following() -> dict[int, int]:
    """token id -> the id the model is built to give after it (the same in every response it is in)."""
    after = {}
    for k in range(len(SAMPLES)):
        response = designed(k)
        for token, next_token in zip(response, response[1:]):
            assert after.setdefault(token, next_token) == next_token, f"{VOCAB[token]} leads to two tokens"
    return after


def prompt_text(k: int) -> str:
    """Sample k's question: some words, its marker, more words (1 to 20 words, so prompts of 5 to
    24 tokens, some prefilled absorbed, some decompressed: MAX_ABSORBED_QUERY_LEN is 16)."""
    before, after = k % 4, (5 * k) % 17
    words = PROMPT_WORDS * 2
    return " ".join([*words[:before], MARKERS[k], *words[before : before + after]])


def build_model(folder: Path):
    """The tiny DeepSeek-V3 (see the module docstring) and its word-level tokenizer with DeepSeek-R1's
    special tokens and chat template, saved as a Hugging Face folder; returns the transformers model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    assert CONTEXT + len(MARKERS) <= HIDDEN
    model = tiny_deepseek(
        folder,
        seed=0,
        vocab_size=len(VOCAB),
        hidden_size=HIDDEN,
        initializer_range=0.02,
        bos_token_id=ID[BOS],
        eos_token_id=ID[EOS],
        pad_token_id=ID[EOS],
    )
    config = model.config
    assert not config.tie_word_embeddings
    rank, q_rank, nope, rope, v_dim = (
        config.kv_lora_rank,
        config.q_lora_rank,
        config.qk_nope_head_dim,
        config.qk_rope_head_dim,
        config.v_head_dim,
    )
    attn = model.model.layers[0].self_attn
    embed = torch.zeros(len(VOCAB), HIDDEN)
    embed[range(len(VOCAB)), range(len(VOCAB))] = SCALE
    embed[:, SHARED] = SCALE
    # Head 0's query: the shared dimension into the bottleneck's first dimension, which q_a_layernorm
    # makes sqrt(q_rank), into the first no-rope dimension; its rope part 0.
    q_a = torch.zeros_like(attn.q_a_proj.weight)
    q_a[0, SHARED] = 1.0
    # The latent: dimension 0 is 1 for any marker, 1 + k for marker k, the last for every token; after
    # kv_a_layernorm, sqrt(rank / 3) in each of a marker's three, sqrt(rank) in the last for others.
    kv_a = torch.zeros_like(attn.kv_a_proj_with_mqa.weight)
    for k, marker in enumerate(MARKERS):
        kv_a[0, ID[marker]] = kv_a[1 + k, ID[marker]] = 1.0
    kv_a[rank - 1, SHARED] = 1.0
    marker_norm = math.sqrt(rank / 3)
    q_b = attn.q_b_proj.weight.clone()
    q_b[: nope + rope] = 0.0
    q_b[0, 0] = MARKER_SCORE / (math.sqrt(q_rank) * marker_norm * attn.scaling)
    # Head 0's key: the latent's marker dimension; its value: which marker (value dimension k).
    kv_b = attn.kv_b_proj.weight.clone()
    kv_b[: nope + v_dim] = 0.0
    kv_b[0, 0] = 1.0
    for k in range(len(MARKERS)):
        kv_b[nope + k, 1 + k] = 1.0
    o = torch.zeros_like(attn.o_proj.weight)  # heads 1-3 compute, and are not heard
    for k in range(len(MARKERS)):
        o[CONTEXT + k, k] = SCALE / marker_norm
    head = torch.zeros(len(VOCAB), HIDDEN)
    for token, next_token in following().items():
        head[next_token, token] += 2 * STEP
    for k in range(len(SAMPLES)):
        head[designed(k)[0], CONTEXT + k] += STEP
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(head)
        attn.q_a_proj.weight.copy_(q_a)
        attn.q_b_proj.weight.copy_(q_b)
        attn.kv_a_proj_with_mqa.weight.copy_(kv_a)
        attn.kv_b_proj.weight.copy_(kv_b)
        attn.o_proj.weight.copy_(o)
    model.save_pretrained(folder)
    words = Tokenizer(models.WordLevel(ID, unk_token=EOS))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=words,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=EOS,
        additional_special_tokens=[USER, ASSISTANT],
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(folder)
    return model


def write_pickle(path: Path) -> Path:
    """The reference's dataset form: a pandas DataFrame, one row per sample, pickled."""
    import pandas as pd

    texts = [prompt_text(k) for k in range(len(SAMPLES))]
    frame = pd.DataFrame(
        {
            "text_input": texts,
            "ground_truth": pd.Series([truth for _, truth, _, _ in SAMPLES], dtype=object),
            "dataset": [name for name, _, _, _ in SAMPLES],
            "question": texts,
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_pickle(path)
    return path


def reference_run(model, model_dir: Path, dataset: Path) -> dict:
    """The transformers implementation on the set, greedy as the reference generates, scored with
    the benchmark's script: the substituted model's reference scores."""
    from accuracy.datasets.reader import load_dataset
    from accuracy.deepseek_r1 import Sample, load_records, score_samples
    from accuracy.evaluate import load_tokenizer

    prompts = [[int(t) for t in ids] for ids in load_dataset(dataset).input_ids]
    outputs = [hf_greedy(model, p, 32, eos_token_id=ID[EOS]) for p in prompts]
    texts = load_tokenizer(model_dir).batch_decode(outputs, skip_special_tokens=True)
    samples = [Sample(i, text, len(out)) for i, (text, out) in enumerate(zip(texts, outputs))]
    result = score_samples(samples, load_records(dataset))
    return {"prompts": prompts, "outputs": outputs, **{k: result[k] for k in ("exact_match", "tokens_per_sample")}}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """(root, tree, the converter's summary, the reference run, each run's verdict line, the
    transformers model)."""
    from accuracy.datasets.deepseek_r1 import convert

    root = tmp_path_factory.mktemp("deepseek-r1-repo")
    model_dir = root / "models" / SYSTEM
    model = build_model(model_dir)
    data = root / "data" / "deepseek-r1"
    pickle = write_pickle(data / "mlperf_deepseek_r1_dataset_16_eval.pkl")
    dataset = data / "deepseek_r1_16.parquet"
    summary = convert(pickle, model_dir, dataset, trust_pickle=True)
    reference = reference_run(model, model_dir, dataset)
    reference_file = root / "reference.json"
    reference_file.write_text(
        json.dumps(
            {
                "model": SYSTEM,
                "implementation": "transformers generate, float32, greedy",
                "scores": {k: reference[k] for k in ("exact_match", "tokens_per_sample")},
                "eos_token_ids": [ID[EOS]],
            }
        )
    )
    write_system(
        root, model_dir, dataset, reference_file, benchmark="deepseek-r1", name=SYSTEM, model_name=SYSTEM,
        num_kv_blocks=512, scenarios=SCENARIOS, user_conf=USER_CONF,
    )  # fmt: skip
    tree, verdicts = run_and_package(root, SYSTEM, "deepseek-r1", SCENARIOS, MODES)
    return root, tree, summary, reference, verdicts, model


def logs(root: Path, mode: str, scenario: str = "Offline") -> Path:
    return root / "build" / "logs" / SYSTEM / "deepseek-r1" / scenario / mode


def responses(log: Path) -> list[tuple[int, list[int]]]:
    """(qsl_idx, the int32 token ids) of every entry of a LoadGen accuracy log, in its order."""
    entries = json.loads(log.read_text())
    return [(e["qsl_idx"], list(memoryview(bytes.fromhex(e["data"])).cast("i"))) for e in entries]


def results(tree: Path, scenario: str) -> Path:
    return tree / "open" / "TestOrg" / "results" / SYSTEM / SYSTEM / scenario


@pytest.mark.slow
def test_the_converter_templates_each_question_and_keeps_the_ground_truth_as_text(chain):
    """The parquet holds each question as the chat template frames it (4 tokens around the words)
    and the ground truths as text, the float 204.0 as "204" and "033" as it was."""
    import pandas as pd

    root, _, summary, reference, _, _ = chain
    assert "wrote 16 samples" in summary
    table = pd.read_parquet(root / "data" / "deepseek-r1" / "deepseek_r1_16.parquet")
    for k in range(len(SAMPLES)):
        words = [ID[w] for w in prompt_text(k).split()]
        assert reference["prompts"][k] == [ID[BOS], ID[USER], *words, ID[ASSISTANT], ID[THINK]]
    assert list(table["ground_truth"]) == [str(t) if t != 204.0 else "204" for _, t, _, _ in SAMPLES]
    assert list(table["dataset"]) == [name for name, _, _, _ in SAMPLES]
    lengths = [len(p) for p in reference["prompts"]]
    assert min(lengths) <= 16 < max(lengths) <= BENCHMARK.max_prompt_tokens


def test_the_model_gives_its_designed_responses_with_wide_margins(chain):
    """The premise, with transformers: after the prompt and every token of a designed response the
    next one leads the logits by more than 50; the greedy reference run gives exactly the designed
    responses, and the accuracy script grades them as counted by hand."""
    _, _, _, reference, _, model = chain
    for k, prompt in enumerate(reference["prompts"]):
        sequence = prompt + designed(k)
        with torch.no_grad():
            logits = model(torch.tensor([sequence])).logits[0, len(prompt) - 1 : -1]
        top = logits.topk(2, dim=-1)
        assert top.indices[:, 0].tolist() == designed(k)
        assert (top.values[:, 0] - top.values[:, 1]).min() > 50
    assert reference["outputs"] == [designed(k) for k in range(len(SAMPLES))]
    assert sum(right for *_, right in SAMPLES) == 11 and sum(len(designed(k)) for k in range(len(SAMPLES))) == 90
    assert reference["exact_match"] == EXACT_MATCH and reference["tokens_per_sample"] == TOKENS_PER_SAMPLE


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_scenario_runs_and_scores_as_designed(chain, scenario):
    root, _, _, _, verdicts, _ = chain
    assert verdicts[scenario, "performance"].startswith(f"{scenario} performance: VALID"), verdicts
    assert verdicts[scenario, "accuracy"].startswith(
        f"{scenario} accuracy: PASS: exact_match {EXACT_MATCH}, tokens_per_sample {TOKENS_PER_SAMPLE}; no errors"
    ), verdicts
    # Through LoadGen and the engine (its MLA reading the marker from the latent cache), each sample's
    # response is the designed one, and accuracy.txt ends as the reference prints its result.
    got = responses(logs(root, "accuracy", scenario) / "mlperf_log_accuracy.json")
    assert sorted(got) == [(k, designed(k)) for k in range(len(SAMPLES))]
    accuracy = (logs(root, "accuracy", scenario) / "accuracy.txt").read_text()
    result = f"{{'exact_match': {EXACT_MATCH}, 'tokens_per_sample': {TOKENS_PER_SAMPLE}, 'num-samples': 16}}"
    assert f"\nResults\n\n{result}\nhash=" in accuracy
    for line in ("gpqa 3 5 4 60.00%", "mmlu_pro 2 3 3 66.67%", "math500 3 4 4 75.00%", "aime 3 4 4 75.00%"):
        assert line in " ".join(accuracy.split()), accuracy
    record = json.loads((logs(root, "accuracy", scenario) / "run.json").read_text())
    assert record["dataset"].endswith("deepseek_r1_16.parquet") and record["model"].endswith(SYSTEM)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_test06_logs_designed_responses_and_passes(chain, scenario):
    root, tree, _, _, verdicts, _ = chain
    logged = responses(logs(root, "TEST06", scenario) / "mlperf_log_accuracy.json")
    # The audit's 100 responses (of every one of the 16 samples), each the designed one.
    assert len(logged) == 100 and {k for k, _ in logged} == set(range(len(SAMPLES)))
    assert all(ids == designed(k) for k, ids in logged)
    verify = (results(tree, scenario) / "TEST06" / "verify_accuracy.txt").read_text()
    first = "Skipped" if scenario == "Offline" else "True"
    assert verify == (
        f"First token check pass: {first}\nEOS check pass: True\nSample length check pass: True\n"
        "TEST06 verification complete\n"
    )


def test_the_tree_passes_the_checker(chain):
    _, tree, _, _, _, _ = chain
    report = check_tree(tree, demo=True)
    assert report.errors == []
    # What the demo knowingly shortens: 16 of the 4388 samples, and the minimum duration.
    assert all(
        any(f"[{rule}]" in w for rule in ("min-duration", "sample-count", "dataset-size")) for w in report.warnings
    ), report.warnings
    assert any("effective_accuracy_sample_count 16 is not the dataset size 4388" in w for w in report.warnings)
    org = tree / "open" / "TestOrg"
    assert json.loads((org / "model_mapping.json").read_text()) == {SYSTEM: "deepseek-r1"}
    assert "exact_match" in (org / "documentation" / f"{SYSTEM}_reference_accuracy.json").read_text()


def copy_of(root: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("submission"))
    return copy


def test_a_harness_that_doubled_an_eos_fails_test06_by_name(chain, tmp_path):
    """A planted defect: one TEST06 response with a second EOS after its own (n_tokens counting it)
    fails the EOS check, in the packager and in the checker."""
    root, _, _, _, _, _ = chain
    copy = copy_of(root, tmp_path)
    log = logs(copy, "TEST06", "Server") / "mlperf_log_accuracy.json"
    entries = json.loads(log.read_text())
    entries[3]["data"] += entries[3]["data"][-8:]
    entries[3]["token_count"] += 1
    log.write_text(json.dumps(entries))
    reseal(log.parent)
    _, failures = package(SYSTEM, copy / "submission", root=copy)
    message = f"qsl_idx {entries[3]['qsl_idx']}: the response ends in more than one EOS token (1, 1)"
    assert failures == [f"{results(copy / 'submission', 'Server')}: TEST06: {message}"]
    errors = check_tree(copy / "submission", demo=True).errors
    assert any("[TEST06] 'EOS check pass' is 'False'" in e for e in errors)
    assert any(f"[TEST06] {message}" in e for e in errors)


def test_a_harness_that_lost_each_answer_fails_the_accuracy_targets(chain, tmp_path):
    """A planted defect: every accuracy response without its last token before EOS (n_tokens saying
    so), scored again as the run scores it: 1 of 16 right (the lone letter H survives), 4.625 tokens a
    sample; the tree packages, and the checker fails both targets of the substituted model."""
    from accuracy.deepseek_r1 import write_accuracy_txt

    root, _, _, _, _, _ = chain
    copy = copy_of(root, tmp_path)
    folder = logs(copy, "accuracy")
    entries = json.loads((folder / "mlperf_log_accuracy.json").read_text())
    for entry in entries:
        entry["data"] = entry["data"][:-16] + entry["data"][-8:]
        entry["token_count"] -= 1
    (folder / "mlperf_log_accuracy.json").write_text(json.dumps(entries))
    dataset = copy / "data" / "deepseek-r1" / "deepseek_r1_16.parquet"
    result = write_accuracy_txt(
        folder / "mlperf_log_accuracy.json", dataset, copy / "models" / SYSTEM, folder / "accuracy.txt"
    )
    assert (result["exact_match"], result["tokens_per_sample"]) == (6.25, 4.625)
    reseal(folder)
    _, failures = package(SYSTEM, copy / "submission", root=copy)
    assert failures == []
    errors = check_tree(copy / "submission", demo=True).errors
    accuracy = results(copy / "submission", "Offline") / "accuracy" / "accuracy.txt"
    assert errors == [
        f"{accuracy}: [accuracy-target] exact_match = 6.25 is not >= {0.99 * EXACT_MATCH:.4f}",
        f"{accuracy}: [accuracy-target] tokens_per_sample = 4.625 is not in "
        f"[{0.9 * TOKENS_PER_SAMPLE:.4f}, {1.1 * TOKENS_PER_SAMPLE:.4f}]",
    ]
