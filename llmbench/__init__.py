"""llmbench: LLM-inference benchmarking and roofline profiling with a built-in engine."""

__version__ = "0.1.0"
