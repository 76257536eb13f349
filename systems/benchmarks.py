"""The benchmark registry: every fact the harness, accuracy and compliance need about one MLPerf
LLM benchmark, in one entry (v6.1; sources in mlperf-rules.md sections 1 and 2, v61-models.md
section 3). A new benchmark is one more entry in ENTRIES.

A benchmark whose runs read more than one dataset (gpt-oss-120b: an accuracy set other than its
performance set, and TEST07's own set) names each other set in `mode_datasets`; a system file then
names the file of each (systems/schema.py). Generation settings can differ by mode
(`generation(mode)`): gpt-oss-120b's accuracy runs may generate 32768 tokens, its performance and
compliance runs 10240, as the reference's generation configs say."""

import re
from dataclasses import dataclass, field

# Scenarios the harness runs ("Interactive" is LoadGen's Server with the "-interactive" model's limits).
SCENARIOS = ("Offline", "Server", "Interactive", "SingleStream")

# The v6.1 checker's required-scenarios-* and optional-scenarios-* lists: system type -> (required,
# optional). With both Server and Interactive optional, one of them is required. A
# "datacenter,edge" system allows what either of its types allows.
DATACENTER = {"datacenter": (frozenset({"Offline"}), frozenset({"Server", "Interactive"}))}
EDGE = {"edge": (frozenset({"Offline", "SingleStream"}), frozenset())}

LLAMA3_EOS = frozenset({128001, 128008, 128009})


def _conf_key(loadgen_model: str, loadgen_scenario: str, key: str) -> re.Pattern:
    return re.compile(rf"^\s*{re.escape(loadgen_model)}\.{loadgen_scenario}\.{key}\s*=\s*(\S*).*$", re.MULTILINE)


def with_conf_value(conf_text: str, loadgen_model: str, loadgen_scenario: str, key: str, value: str) -> str:
    """A user.conf's text with `loadgen_model.loadgen_scenario.key = value`, replacing the line that
    sets it or, where none does, appended."""
    pattern = _conf_key(loadgen_model, loadgen_scenario, key)
    line = f"{loadgen_model}.{loadgen_scenario}.{key} = {value}"
    return pattern.sub(line, conf_text) if pattern.search(conf_text) else conf_text.rstrip("\n") + "\n" + line + "\n"


def loadgen_double(value: float, decimals: int) -> float:
    """`value` for a double setting of a user.conf (target_qps) as LoadGen logs it back: LoadGen
    reads it with strtod and logs it with C++'s default stream precision, six significant digits,
    so a value with more (1006.151) comes back as another (1006.15). Rounded to six significant
    digits or `decimals` decimals, whichever is coarser, it is one the conf, our records and
    LoadGen's log all give alike (`str` of it is what to write)."""
    return round(float(f"{value:.6g}"), decimals)


def conf_value(conf_text: str, loadgen_model: str, loadgen_scenario: str, key: str) -> str | None:
    """The value a user.conf's text sets for `loadgen_model.loadgen_scenario.key`, or None."""
    found = _conf_key(loadgen_model, loadgen_scenario, key).search(conf_text)
    return found.group(1) if found else None


@dataclass(frozen=True)
class AccuracyTarget:
    """A metric's bounds as shares of the reference implementation's score."""

    reference: float
    low: float  # the result must reach reference * low
    high: float | None = None  # and, where set, stay at most reference * high

    def bounds(self) -> tuple[float, float | None]:
        return self.reference * self.low, None if self.high is None else self.reference * self.high


@dataclass(frozen=True)
class DatasetFile:
    """A dataset as the reference distributes it: its file (path in the reference's download) and
    how many samples it holds."""

    name: str
    samples: int


@dataclass(frozen=True)
class SpeculationRule:
    """Speculative decoding as the closed division allows it for a benchmark (the v6.1 rules'
    appendix "Speculative Decoding"): the reference's method with the reference's own head and
    number of draft tokens, nothing tuned."""

    method: str  # the engine's speculative_config.method
    head: str | None  # the reference's draft head (a Hugging Face repository); None: the model's own layers
    num_speculative_tokens: int  # the reference's draft steps (its top-k is 1: one chain of drafts)

    def describe(self) -> str:
        head = f"head {self.head}" if self.head else "the model's own MTP layers"
        return f"method {self.method!r}, {head}, num_speculative_tokens {self.num_speculative_tokens}"


@dataclass(frozen=True)
class Benchmark:
    name: str  # submission directory name
    loadgen_model: str  # first field of mlperf.conf keys
    dataset_size: int
    max_new_tokens: int
    min_new_tokens: int
    eos_token_ids: frozenset  # of the benchmark's own model, for TEST06's EOS check
    latency_limits_ms: dict  # scenario -> (p99 TTFT, p99 TPOT) limits in ms, as mlperf.conf sets them
    accuracy: dict  # metric -> AccuracyTarget
    scenarios: dict = field(default_factory=lambda: DATACENTER)  # system type -> (required, optional)
    compliance_tests: tuple = ("TEST06",)
    equal_issue: bool = True  # mlperf.conf sets sample_concatenate_permutation = 1 (all the LLMs)
    ready: bool = True  # False: its facts are recorded, but nothing here runs or checks it yet
    # Where the closed division allows speculative decoding, and then only with the reference's own
    # head (MTP / EAGLE; the v6.1 rules' appendix "Speculative Decoding"): nowhere else.
    speculative_scenarios: tuple = ()
    speculation: SpeculationRule | None = None  # how it may speculate there
    # Generation as the reference SUT generates: greedy by default; temperature, top_p (1: off) and
    # top_k (0: off) where it samples. Accuracy runs may allow more new tokens than the others.
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    accuracy_max_new_tokens: int | None = None  # None: max_new_tokens
    # How the accuracy script scores: "summarization" (ROUGE on text decoded without special tokens,
    # accuracy/evaluate.py), "gpt_oss" (accuracy/gpt_oss.py: special tokens kept, the harmony
    # final channel parsed) or "deepseek_r1" (accuracy/deepseek_r1.py: special tokens skipped, each
    # sub-dataset's answer parsed and graded); skip_special_tokens says which decoding the script uses.
    scorer: str = "summarization"
    skip_special_tokens: bool = True
    # mode -> the set a mode runs on where it is not the performance set (mode "accuracy", a
    # compliance test's "TEST0x"); every other mode runs on the performance set of dataset_size samples.
    mode_datasets: dict = field(default_factory=dict)
    # The most tokens a sample's input may have (the reference's limit), where the benchmark sets one,
    # and the tokens the reference allows the model's chat template to add around it.
    max_input_tokens: int | None = None
    chat_template_tokens: int = 0

    @property
    def test06(self) -> bool:
        return "TEST06" in self.compliance_tests

    @property
    def accuracy_dataset_size(self) -> int:
        """The samples an accuracy run covers (mlperf.conf's accuracy_sample_count_override, where set)."""
        own = self.mode_datasets.get("accuracy")
        return own.samples if own else self.dataset_size

    @property
    def max_prompt_tokens(self) -> int | None:
        """The most tokens a prompt as the model gets it may have (None: no limit but the model's)."""
        return None if self.max_input_tokens is None else self.max_input_tokens + self.chat_template_tokens

    def max_tokens(self, mode: str) -> int:
        """The most new tokens a response may have in a run of `mode`."""
        if mode == "accuracy" and self.accuracy_max_new_tokens is not None:
            return self.accuracy_max_new_tokens
        return self.max_new_tokens

    def generation(self, mode: str) -> dict:
        """The engine's sampling settings for a run of `mode` (sut.SamplingParams's names); a sampled
        benchmark's per-request seeds are the harness's (harness/run.py)."""
        return {
            "max_tokens": self.max_tokens(mode),
            "min_tokens": self.min_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
        }

    def targets(self) -> dict[str, tuple[float, float | None]]:
        """metric -> (lowest allowed, highest allowed or None)."""
        return {metric: target.bounds() for metric, target in self.accuracy.items()}

    def loadgen_name(self, scenario: str) -> str:
        """The model name of LoadGen's config keys in `scenario`."""
        return self.loadgen_model + ("-interactive" if scenario == "Interactive" else "")


def _rouge(rouge1: float, rouge2: float, rouge_l: float, rouge_lsum: float | None, share: float) -> dict:
    scores = {"rouge1": rouge1, "rouge2": rouge2, "rougeL": rouge_l, "rougeLsum": rouge_lsum}
    return {metric: AccuracyTarget(score, share) for metric, score in scores.items() if score is not None}


ENTRIES = (
    Benchmark(
        "llama3.1-8b",
        "llama3_1-8b",
        13368,
        128,
        1,
        LLAMA3_EOS,
        {"Server": (2000, 100), "Interactive": (500, 30)},
        {**_rouge(38.7792, 15.9075, 24.4957, 35.793, 0.99), "gen_len": AccuracyTarget(8167644, 0.9, 1.1)},
    ),
    Benchmark(
        "llama3.1-8b-edge",
        "llama3_1-8b-edge",
        5000,
        128,
        1,
        LLAMA3_EOS,
        {},  # SingleStream and Offline
        {**_rouge(39.06, 16.1147, 24.6375, 36.124, 0.99), "gen_len": AccuracyTarget(3051113, 0.9, 1.1)},
        EDGE,
        compliance_tests=(),
    ),
    Benchmark(
        "llama2-70b-99.9",
        "llama2-70b",
        24576,
        1024,
        1,
        frozenset({2}),
        {"Server": (2000, 200), "Interactive": (450, 40)},
        {**_rouge(44.4312, 22.0352, 28.6162, None, 0.999), "tokens_per_sample": AccuracyTarget(294.45, 0.9, 1.1)},
    ),
    # language/deepseek-r1 in mlcommons/inference: utils/backend_registry.py (MAX_ISL 3136, MAX_OSL
    # 20000, temperature 0), loadgen/mlperf.conf (performance_sample_count_override and Offline
    # min_query_count 4388; Server ttft_latency 2000 / tpot_latency 80, deepseek-r1-interactive 1500 /
    # 15), the v6.1 checker's constants (accuracy-target exact_match 0.99 x 81.3582 and
    # TOKENS_PER_SAMPLE 0.9 x 3886.2274, accuracy-upper-limit TOKENS_PER_SAMPLE 1.1 x 3886.2274,
    # models_TEST06, LLM_LATENCY_LIMITS); deepseek-ai/DeepSeek-R1's config: eos_token_id 1
    # (<｜end▁of▁sentence｜>). Its dataset is the reference's pickle tokenized once with the model's chat
    # template (python -m accuracy.datasets.deepseek_r1 convert).
    Benchmark(
        "deepseek-r1",
        "deepseek-r1",
        4388,  # mlperf_deepseek_r1_dataset_4388_fp8_eval.pkl, the set of every run
        20000,
        1,
        frozenset({1}),
        {"Server": (2000, 80), "Interactive": (1500, 15)},
        {"exact_match": AccuracyTarget(81.3582, 0.99), "tokens_per_sample": AccuracyTarget(3886.2274, 0.9, 1.1)},
        speculative_scenarios=("Interactive",),
        # EAGLE-style with DeepSeek-R1's own MTP layer, speculative-num-steps 3, top-k 1
        speculation=SpeculationRule("mtp", None, 3),
        scorer="deepseek_r1",
        max_input_tokens=3136,  # MAX_ISL, a question's tokens
        chat_template_tokens=4,  # MAX_TEMPLATE_TOKS: vLLM's max_input_len is their sum
    ),
    # language/gpt-oss-120b in mlcommons/inference: an SGLang server with dp N, tp = ep = 1 (one GPU
    # a replica); generation_config.json and README "Generation Configuration" for the sampling and
    # the new tokens of each mode; the model's generation_config.json for its EOS tokens.
    Benchmark(
        "gpt-oss-120b",
        "gpt-oss-120b",
        6396,  # perf/perf_eval_ref.parquet (mlperf.conf performance_sample_count_override)
        10240,  # performance runs and both compliance tests (the perf generation config)
        1,
        # <|return|> (ends a final message), <|endoftext|>, <|call|> (ends a tool call)
        frozenset({200002, 199999, 200012}),
        {"Server": (3000, 80), "Interactive": (2000, 15)},
        # tokens_per_sample's 9999 is marked "placeholder" in the checker's source
        {"exact_match": AccuracyTarget(83.13, 0.99), "tokens_per_sample": AccuracyTarget(9999, 0.0, 1.1)},
        compliance_tests=("TEST07", "TEST09"),
        speculative_scenarios=("Interactive",),
        speculation=SpeculationRule("eagle3", "nvidia/gpt-oss-120b-Eagle3-long-context", 3),
        temperature=1.0,
        top_p=1.0,
        top_k=0,  # the reference's -1: off
        accuracy_max_new_tokens=32768,
        scorer="gpt_oss",
        skip_special_tokens=False,
        mode_datasets={
            # AIME25 x 8, GPQA-Diamond x 5, LiveCodeBench v6 x 3 (accuracy_sample_count_override)
            "accuracy": DatasetFile("acc/acc_eval_inputs.parquet", 4395),
            # GPQA-Diamond x 5, prompted with high reasoning effort (compliance/TEST07/README.md)
            "TEST07": DatasetFile("acc/acc_eval_compliance_gpqa.parquet", 990),
            # TEST09 runs on the performance set (compliance/TEST09/README.md): no entry
        },
    ),
)
# What the harness runs and the checker checks.
BENCHMARKS = {b.name: b for b in ENTRIES if b.ready}
