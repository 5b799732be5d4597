"""The built-in inference engine: config, weights, tokenizer, model, KV cache, sampling."""
