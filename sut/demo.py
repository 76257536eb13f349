"""The CPU demo behind `make submission` until the LoadGen harness lands: a few chat prompts
through SmolLM2 on the engine, with the throughput it got."""

import argparse
import time

from sut import LLM, SamplingParams

QUESTIONS = [
    "Summarize in one sentence: The city council voted on Tuesday to extend the tram line to the airport, "
    "a project expected to take four years and cost 300 million euros.",
    "What is the boiling point of water at sea level?",
    "Give two reasons why people keep dogs as pets.",
    "Explain what a KV cache is in a language model, briefly.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    llm = LLM(args.model)
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                 tokenize=True)["input_ids"] for q in QUESTIONS]
    start = time.perf_counter()
    outputs = llm.generate(prompts, SamplingParams(max_tokens=args.max_tokens), use_tqdm=True)
    seconds = time.perf_counter() - start
    for question, out in zip(QUESTIONS, outputs):
        print(f"\n> {question}\n{out.text}")
    tokens = sum(len(o.token_ids) for o in outputs)
    print(f"\ndemo: {len(outputs)} requests, {tokens} tokens in {seconds:.1f} s ({tokens / seconds:.1f} tokens/s)")


if __name__ == "__main__":
    main()
