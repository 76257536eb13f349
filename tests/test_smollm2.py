"""SmolLM2-135M-Instruct, 16 real chat prompts x 64 new tokens, batched in our engine: every output
token-identical to transformers' greedy generate. A divergence is accepted only where the two
top logits of transformers' model were within 1e-4 at that step (a genuine near-tie)."""

import pytest
import torch

from sut import LLM, SamplingParams

QUESTIONS = [
    "Explain how a bicycle works.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are the main causes of the French Revolution?",
    "Describe the water cycle for a ten-year-old.",
    "Give three tips for writing clear emails at work.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "What is the difference between a virus and a bacterium?",
    "How do I make a simple tomato sauce?",
    "List some benefits of regular exercise and explain each briefly.",
    "Explain what a hash table is and when to use one.",
    "Write a polite letter declining a job offer.",
    "What should a beginner know before planting a vegetable garden?",
    "Describe the life cycle of a star like the Sun.",
    "How does compound interest work? Give an example.",
    "Why do cats purr?",
]
NEW_TOKENS = 64
NEAR_TIE = 1e-4


@pytest.fixture(scope="module")
def hf_model(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.mark.slow
def test_smollm2_batched_greedy_matches_transformers(smollm2_dir, hf_model):
    llm = LLM(smollm2_dir, max_num_batched_tokens=512)
    tok = llm.tokenizer
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
        for q in QUESTIONS
    ]
    ours = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))]
    exact, near_ties = 0, []
    for prompt, got in zip(prompts, ours):
        with torch.no_grad():
            full = hf_model.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=2
            )[0, len(prompt) :].tolist()
        if got == full:
            exact += 1
            continue
        j = next(i for i in range(min(len(got), len(full)) + 1) if i == len(got) or i == len(full) or got[i] != full[i])
        assert j < len(got) and j < len(full), f"one output is a prefix of the other: ours {got}, hf {full}"
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + full[:j]])).logits[0, -1]
        top2 = torch.topk(logits, 2).values
        gap = float(top2[0] - top2[1])
        assert gap < NEAR_TIE, f"diverged at new token {j} ({got[j]} vs {full[j]}) with a top-2 logit gap of {gap}"
        near_ties.append(gap)
    assert exact + len(near_ties) == len(QUESTIONS)
    assert exact >= len(QUESTIONS) - 2, f"only {exact} of {len(QUESTIONS)} outputs identical (near ties {near_ties})"
