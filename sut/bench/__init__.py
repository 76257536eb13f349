"""The engine's benchmarks, on top of its layers: throughput against transformers (`make bench`),
single steps and the host's share of one, speculative decoding against plain decoding (`make
spec-bench`), and the GPU check (`make gpu-check`): its run, the engine's steps on a GPU, the
machine's measured peaks and the results page. The engine never imports them."""
