"""autotune: find the best vLLM launch flags for a model, GPU, workload and latency SLO."""

__version__ = "0.1.0"
