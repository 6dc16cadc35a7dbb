"""The simulated vLLM V1 engine: hardware and model catalogs, memory model, step costs, scheduler."""
