"""Sampling: the sampler (greedy, or temperature, top-k and top-p drawn from each request's own
generator) and speculative decoding's verifier, which keeps or rejects a sequence's drafts by
exact rejection sampling (kernels/rejection_sample.py)."""
