"""The kernels layer: Triton kernels, each with its torch reference, cost function and checks.

Layer 0: imports nothing from llmbench. One file per kernel (`rms_norm`, `rope`, `silu_and_mul`,
`kv_cache_write`, `decode_attention`, `prefill_attention`, `kv_quant`); `dispatch` says which
implementation each op uses on a device. Triton is optional: without it every module still
imports and its torch reference runs. On a CPU, one C++ extension (`csrc/`, built and loaded by
`cpu_extension`) holds the ops of `cpu_gemv`, `cpu_quant_gemv` and `cpu_layer_ops`.
"""
