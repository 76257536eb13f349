"""The engine: `LLMEngine` and its step (schedule, execute, update), the scheduler with its batching
policies and the block manager, request checks, the settings resolved once against the model and
machine, and the engine clients behind one interface (`make_engine`): data-parallel replicas and
disaggregated prefill and decode workers with their KV transfer; `LLM` on top."""
