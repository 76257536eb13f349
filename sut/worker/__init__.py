"""What runs the model: the model runner (a batch into a StepInput, the forward on it, the KV-cache
pool), the KV cache's layout and size, decode steps from CUDA graphs, and the tensor-parallel
ranks other than rank 0, spawned by the engine or started by torchrun."""
