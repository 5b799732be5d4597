"""What weight quantization costs in quality, per scheme and per lm_head choice, on one text.

    python benchmarks/quant_quality.py [--model smollm2-135m] [--tokens 2048]

Scores the English prose of the standard library's `pydoc_data.topics` (present on every
machine) with the engine's own forward pass (`LLMEngine.score`) and compares every
configuration with the unquantised model in float32: perplexity, mean KL(reference ‖ config) of
the next-token distributions, and top-1 agreement. The lm_head is varied apart from the layers
(the model's dtype, int8, int4:32:asym) to decide what `quant.scheme.lm_head_scheme` picks.
`llmbench quality` is the user-facing command for this; this script only backs that choice.

Measured here (smollm2-135m GGUF, 2,048 tokens, bfloat16 activations, reference float32; the
deciding numbers, quality does not depend on the machine's load):

    layers        lm_head      ppl     KL      top-1   weight bytes a step
    float32 (reference)        11.88
    bfloat16      bfloat16     11.89   0.0010  0.978   257 MiB
    int8          bfloat16     11.93   0.0038  0.967   156 MiB
    int8          int8         11.94   0.0053  0.963   129 MiB
    int4:32:sym   int8         15.58   0.2962  0.761    90 MiB
    int4:32       bfloat16     11.90   0.0012  0.980   117 MiB
    int4:32       int8         11.91   0.0028  0.969    90 MiB
    int4:32       int4:32      12.42   0.0501  0.876    80 MiB
    int4:64       int8         15.95   0.2495  0.772    84 MiB
    int4:128      int8         18.58   0.4120  0.699    85 MiB

The layers of this GGUF are Q4_1 (blocks of 32 with a minimum), which `int4:32` reproduces up to
the bfloat16 rounding of its scales and zero points: hence its near-zero cost here, and the
large one of the symmetric grid and of coarser groups (each re-quantises Q4_1's levels). Its
lm_head is Q8_0. `int4:128` holds more bytes than `int4:64`: 576 columns are 4.5 groups of
128, the last one padded.
"""

from __future__ import annotations

import argparse
import math

import torch

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.linear import make_linear
from llmbench.engine.quant.scheme import parse_quantize

LAYERS = ["none", "int8", "int8", "int4:32:sym", "int4:32", "int4:32", "int4:32", "int4:64"]
LAYERS += ["int4:128"]
LM_HEADS = ["none", "none", "int8", "int8", "none", "int8", "int4:32", "int8", "int8"]


def evaluation_tokens(engine: LLMEngine, num_tokens: int) -> list[int]:
    """The first `num_tokens` tokens of pydoc_data.topics' prose, topics in sorted order."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))
    return engine.tokenizer.encode(text)[:num_tokens]


def scores(logits: torch.Tensor, ref_logp: torch.Tensor, targets: torch.Tensor) -> tuple:
    """(perplexity, mean KL(ref ‖ this), top-1 agreement) of logits [T-1, V] against the
    reference log-probabilities and the text's next tokens."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    nll = -logp.gather(1, targets[:, None]).mean().item()
    kl = (ref_logp.exp() * (ref_logp - logp)).sum(dim=-1).mean().item()
    top1 = (logp.argmax(dim=-1) == ref_logp.argmax(dim=-1)).float().mean().item()
    return math.exp(nll), kl, top1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    config = EngineConfig(model=args.model, device="cpu", max_num_seqs=1)
    reference = LLMEngine(config)
    tokens = evaluation_tokens(reference, args.tokens)
    targets = torch.tensor(tokens[1:])
    ref_logits = reference.score(tokens)[:-1]
    ref_logp = torch.log_softmax(ref_logits.float(), dim=-1)
    del reference
    print(f"{'layers':<15} {'lm_head':<13} {'ppl':>6} {'KL':>7} {'top-1':>7}   weight bytes")
    ppl, _, _ = scores(ref_logits, ref_logp, targets)
    print(f"{'float32 (reference)':<29} {ppl:6.2f}")
    for layers, lm_head in zip(LAYERS, LM_HEADS, strict=True):
        engine = LLMEngine(
            EngineConfig(**{**vars(config), "dtype": args.dtype, "quantize": layers})
        )
        model = engine.model
        if not engine.model_config.tie_word_embeddings:
            raise SystemExit(f"{args.model}: untied lm_head; this script varies a tied one")
        table = model.embed_tokens  # the tied lm_head's matrix
        model.lm_head = make_linear(table, None, parse_quantize(lm_head))
        ppl, kl, top1 = scores(engine.score(tokens)[:-1], ref_logp, targets)
        held = model.weight_bytes
        streamed = held["layers"] + held["final_norm"] + held["lm_head"]
        print(
            f"{layers:<15} {lm_head:<13} {ppl:6.2f} {kl:7.4f} {top1:7.3f}   "
            f"{streamed / 2**20:.0f} MiB",
            flush=True,
        )


if __name__ == "__main__":
    main()
