"""A user's own traffic for the report, in place of the benchmark's dataset:
`make report TRAFFIC=FILE` (`python -m harness.measure.report --traffic FILE`).

The file is JSON Lines, one request per line:
- its prompt: `prompt`, the user's message as text (put through the model's chat template where its
  tokenizer has one, as the demo's dataset is), or `prompt_token_ids`, taken as they are;
- its response: `output_tokens`, the length it had (each run generates exactly that many tokens,
  EOS ignored, so that the load is the sample's), and/or `reference`, a reference answer (the
  quality figures score the responses against it; without `output_tokens` generation stops as the
  benchmark's settings stop it);
- optionally `arrival_s`, when it arrived (seconds, from any origin; non-decreasing).

`convert` writes it in the benchmark's dataset form (accuracy/datasets/reader.py: `tok_input`, `output`,
`output_tokens`) for `harness run --dataset`, and returns the arrival times where every line has one.
With them, the report's capacity search replays the sequence scaled to each rate it tries
(harness/measure/replay.py: LoadGen draws Poisson arrivals and follows no other schedule); without them,
its LoadGen trials draw Poisson arrivals. The page says which.
"""

import json
from pathlib import Path

EXAMPLE = Path(__file__).with_name("traffic_example.jsonl")  # a small sample, for the test and the README
KEYS = {"prompt", "prompt_token_ids", "output_tokens", "reference", "arrival_s"}


class TrafficError(ValueError):
    """A traffic file that cannot be used; the message names the line and the field."""


def read_lines(path: Path) -> list[dict]:
    if not path.is_file():
        raise TrafficError(f"{path}: traffic file not found")
    requests = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}: line {n}"
        try:
            request = json.loads(line)
        except json.JSONDecodeError as e:
            raise TrafficError(f"{where}: not JSON ({e})") from None
        if not isinstance(request, dict):
            raise TrafficError(f"{where}: expected a JSON object, got {type(request).__name__}")
        unknown = sorted(set(request) - KEYS)
        if unknown:
            raise TrafficError(f"{where}: unknown fields {unknown}; known: {sorted(KEYS)}")
        if ("prompt" in request) == ("prompt_token_ids" in request):
            raise TrafficError(f"{where}: give the prompt as 'prompt' (text) or 'prompt_token_ids', one of them")
        if "output_tokens" not in request and "reference" not in request:
            raise TrafficError(f"{where}: give the response's 'output_tokens' (its length), a 'reference', or both")
        length = request.get("output_tokens")
        if length is not None and (type(length) is not int or length < 1):
            raise TrafficError(f"{where}: 'output_tokens' must be a positive integer, got {length!r}")
        arrival = request.get("arrival_s")
        if arrival is not None and (isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or arrival < 0):
            raise TrafficError(f"{where}: 'arrival_s' must be a number of seconds >= 0, got {arrival!r}")
        requests.append({**request, "line": n})
    if not requests:
        raise TrafficError(f"{path}: no requests in it")
    arrivals = [r.get("arrival_s") for r in requests]
    if any(a is not None for a in arrivals) and None in arrivals:
        raise TrafficError(f"{path}: line {requests[arrivals.index(None)]['line']} has no 'arrival_s' where others do")
    if None not in arrivals and any(b < a for a, b in zip(arrivals, arrivals[1:])):
        raise TrafficError(f"{path}: 'arrival_s' goes back in time; give the requests in arrival order")
    return requests


def prompt_ids(request: dict, tokenizer, vocab_size: int, where: str) -> list[int]:
    if "prompt_token_ids" in request:
        ids = request["prompt_token_ids"]
        if not isinstance(ids, list) or not ids or not all(type(t) is int and 0 <= t < vocab_size for t in ids):
            raise TrafficError(f"{where}: 'prompt_token_ids' must be a non-empty list of ids in [0, {vocab_size})")
        return ids
    text = request["prompt"]
    if not isinstance(text, str) or not text.strip():
        raise TrafficError(f"{where}: 'prompt' must be non-empty text")
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
    return tokenizer.encode(text, add_special_tokens=False)


def convert(path: Path, tokenizer, out: Path) -> list[float] | None:
    """Write the traffic at `path` as a dataset file at `out`; return its arrival times (None where
    it has none)."""
    requests = read_lines(path)
    records = []
    for request in requests:
        where = f"{path}: line {request['line']}"
        reference = request.get("reference", "")
        if not isinstance(reference, str):
            raise TrafficError(f"{where}: 'reference' must be text")
        records.append(
            {
                "tok_input": prompt_ids(request, tokenizer, len(tokenizer), where),
                "output": reference,
                "output_tokens": request.get("output_tokens"),
            }
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records) + "\n")
    arrivals = [r.get("arrival_s") for r in requests]
    return None if None in arrivals else arrivals


def mean_interval_s(arrivals: list[float]) -> float | None:
    """The sample's mean time between arrivals (None with fewer than two, or all at once)."""
    if len(arrivals) < 2 or arrivals[-1] == arrivals[0]:
        return None
    return (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
