"""Time single engine steps: a decode step at several batch sizes, and a prefill of several prompt
lengths. These bound what a Server run can meet: every decode step is part of each running
request's time per output token.

    python -m sut.step_bench --model DIR [--dtype float32|bfloat16] [--thread] [--no-quantized-weights | --int16]

--thread runs the steps in a second thread instead of the main one, which on CPU is slower (the
reason the LoadGen harness steps the engine in the main thread). --no-quantized-weights runs every
CPU linear on its fp32 weights (sut/cpu/quant.py says when the quantized ones are used); --int16
computes every linear from the quantized weights with int16 inputs (engine setting
cpu.int16_activations, as the CPU demo runs).
"""

import argparse
import statistics
import threading
import time

from sut import LLMEngine, SamplingParams

PROMPT = list(range(100, 300))  # 200 ordinary token ids


def decode_step_ms(engine: LLMEngine, batch: int, steps: int = 10) -> float:
    params = SamplingParams(max_tokens=steps + 20, min_tokens=steps + 20)
    for i in range(batch):
        engine.add_request(PROMPT, params, request_id=f"decode-{batch}-{i}")
    engine.step()  # the prefill of all of them (the budget holds it)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    while engine.has_unfinished():
        engine.step()
    return statistics.median(times) * 1000


def prefill_ms(engine: LLMEngine, length: int) -> float:
    engine.add_request(list(range(100, 100 + length)), SamplingParams(max_tokens=1), request_id=f"prefill-{length}")
    start = time.perf_counter()
    engine.step()
    elapsed = time.perf_counter() - start
    while engine.has_unfinished():
        engine.step()
    return elapsed * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--thread", action="store_true", help="step the engine in a thread other than the main one")
    parser.add_argument("--no-quantized-weights", action="store_true",
                        help="engine setting cpu.quantized_weights=False")
    parser.add_argument("--int16", action="store_true", help="engine setting cpu.int16_activations=True")
    args = parser.parse_args()
    engine = LLMEngine(args.model, dtype=args.dtype, max_num_seqs=64, max_num_batched_tokens=4096,
                       cpu={"quantized_weights": not args.no_quantized_weights, "int16_activations": args.int16})

    def measure() -> None:
        for batch in (1, 4, 8, 16):
            print(f"decode step, batch {batch:3d}: {decode_step_ms(engine, batch):7.1f} ms (median of 10)")
        for length in (64, 128, 256, 512):
            print(f"prefill of {length:3d} tokens: {prefill_ms(engine, length):7.1f} ms")

    if args.thread:
        worker = threading.Thread(target=measure)
        worker.start()
        worker.join()
    else:
        measure()


if __name__ == "__main__":
    main()
