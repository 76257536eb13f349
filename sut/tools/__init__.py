"""Offline tools that write model folders, run once before the engine: the GGUF converter that turns
the demo model into a Hugging Face folder with its quantized blocks beside it (`make models`), and
the layer-skip draft maker for speculative decoding (`make drafts`)."""
