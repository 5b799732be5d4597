"""Weight-only quantization of the linear layers, done at load: `scheme` names and parses what a
user asks for (torch-free), `codes` quantises and dequantises tensors (pure functions), `linear`
holds the quantised layers the model calls."""
