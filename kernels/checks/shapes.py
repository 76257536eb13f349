"""The served models' shapes that the GPU check tests and benchmarks the kernels at: gpt-oss-120b's
and DeepSeek-R1's (kernels/checks/gpu_cases.py and gpu_bench.py; the results page's headings,
sut/bench/gpu_report.py). Llama-3.1-8B's attention shape is the benchmarks' `BENCH_HEADS`."""

# gpt-oss-120b's attention: 64 query heads over 8 KV heads, head_dim 64, a learned sink per query
# head on every layer and a 128-key sliding window on every other one.
GPT_OSS_HEADS = (64, 8, 64)
GPT_OSS_WINDOW = 128

# DeepSeek-R1's attention (MLA). Absorbed: one KV head of 576 dims a token (512 latent, 64 rope; V the
# first 512, a view of the same cache) under all query heads: 128 on one GPU, 16 a GPU at tensor
# parallel 8. Decompressed (prefill): 192-dim keys (128 + 64 rope) and 128-dim values a head.
MLA_ABSORBED_HEADS = (128, 16)
MLA_ABSORBED_DIMS = (576, 512)
MLA_DECOMPRESSED = (128, 192, 128)  # heads (= KV heads), K's head dim, V's

# gpt-oss-120b's MoE layer: hidden, expert intermediate, experts, top-k; and the batches (tokens) it is
# checked and benchmarked at (decode at 1 and 64, a mixed step at 512, a prefill chunk at 2048).
MOE_SHAPE = (2880, 2880, 128, 4)
MOE_TOKENS = [1, 64, 512, 2048]
