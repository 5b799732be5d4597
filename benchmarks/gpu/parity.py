"""Step `parity`: the engine on this device against `transformers`, on the tiny random
checkpoints the tests use (`tests/engine/helpers.py`: Llama; `tests/engine/test_moe.py`:
Qwen3-MoE), prefill plus `num_decode_steps` greedy decode steps, per dtype.

Two checks a case:

- tokens: the engine's greedy tokens (its real path: paged cache, decode steps, CUDA graphs on
  a GPU) against `generate`'s. float32 must agree on every token. 16-bit may part where
  `transformers`' own top two logits were within the tolerance (a near-tie: rounding decides
  it), nowhere else.
- logits: both models run prompt + `transformers`' tokens (teacher forcing: same inputs even
  after a divergence); the engine's through `LLMEngine.score`, its own prefill path.
  Formula: relative error = max |ours − theirs| / max |theirs| over the decode positions;
  within TOLERANCE[dtype].

    python -m benchmarks.gpu.parity --work DIR --device cuda --dtypes float32,bfloat16
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.gpu.part_records import PartWriter

# Max relative logit error per dtype: float32 accumulates the same sums in another order;
# 16-bit rounds every activation (8 bits of mantissa in bfloat16: ~4e-3 each, over two layers).
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}
PROMPT_LEN = 37


def write_checkpoint(folder: Path, arch: str) -> Path:
    """The tests' tiny random checkpoint of `arch` (llama or qwen3-moe) in `folder`."""
    if arch == "llama":
        from tests.engine.helpers import write_tiny_checkpoint

        return write_tiny_checkpoint(folder, arch="llama")
    from tests.engine.test_moe import write_tiny_moe_checkpoint

    return write_tiny_moe_checkpoint(folder, arch)


def first_divergence(ours: list[int], theirs: list[int]) -> int | None:
    """The first index where two token lists differ (None: they agree over the shorter)."""
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return i
    return None


def tokens_pass(dtype: str, divergence: int | None, margins: list[float], scale: float) -> bool:
    """float32: no divergence. 16-bit: none, or one where `transformers`' top-two margin was
    within the dtype's tolerance of the logits' scale (a near-tie).

    Formula: divergence is None or (dtype ≠ float32 and margins[i] <= TOLERANCE · scale).
    """
    if divergence is None:
        return True
    return dtype != "float32" and margins[divergence] <= TOLERANCE[dtype] * scale


def parity_case(folder: Path, arch: str, dtype: str, device: str, num_decode_steps: int) -> dict:
    """One (model, dtype) case: tokens and teacher-forced logits, engine vs transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmbench.engine.engine import DTYPES, EngineConfig, LLMEngine
    from llmbench.engine.sampling import SamplingParams
    from tests.engine.helpers import VOCAB

    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=generator).tolist()
    num_tokens = num_decode_steps + 1  # the prefill's token, then one per decode step
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPES[dtype]).to(device)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt], device=device),
            max_new_tokens=num_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=0,
        )
        theirs = out.sequences[0, len(prompt) :].tolist()
        margins = [float(s[0].float().topk(2).values.diff().abs()) for s in out.logits]
        forced = torch.tensor([prompt + theirs[:-1]], device=device)
        their_logits = hf(forced).logits[0, len(prompt) - 1 :].float().cpu()
    del hf
    engine = LLMEngine(
        EngineConfig(
            model=str(folder),
            dtype=dtype,
            device=device,
            kv_cache_memory=1 << 24,
            max_num_seqs=4,
            enable_prefix_caching=False,
        )
    )
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    ours = engine.generate([prompt], params)[0]
    our_logits = engine.score(prompt + theirs[:-1])[len(prompt) - 1 :].float().cpu()
    scale = float(their_logits.abs().max())
    error = float((our_logits - their_logits).abs().max()) / scale
    divergence = first_divergence(ours, theirs)
    return {
        "arch": arch,
        "dtype": dtype,
        "device": device,
        "num_tokens": num_tokens,
        "num_agreed": num_tokens if divergence is None else divergence,
        "first_divergence": divergence,
        "margin_at_divergence": None if divergence is None else margins[divergence],
        "logit_scale": scale,
        "logit_rel_error": error,
        "tolerance": TOLERANCE[dtype],
        "kernels": engine.model.kernels_description,
        "is_pass": tokens_pass(dtype, divergence, margins, scale) and error <= TOLERANCE[dtype],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--archs", default="llama,qwen3-moe")
    parser.add_argument("--decode-steps", type=int, default=20)
    args = parser.parse_args()
    writer = PartWriter(args.work / "parity.jsonl")
    num_failed = 0
    with tempfile.TemporaryDirectory(prefix="sitting-parity-") as tmp:
        for arch in args.archs.split(","):
            folder = write_checkpoint(Path(tmp) / arch, arch)
            for dtype in args.dtypes.split(","):
                try:
                    row = parity_case(folder, arch, dtype, args.device, args.decode_steps)
                except Exception as error:  # recorded; the other cases still run
                    writer.error(f"{arch} {dtype}", error)
                    num_failed += 1
                    continue
                writer.row("parity", row)
                print(row)
                num_failed += not row["is_pass"]
    if num_failed:
        raise SystemExit(f"parity: {num_failed} case(s) failed or did not agree")


if __name__ == "__main__":
    main()
