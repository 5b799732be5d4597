"""`llmbench moe prune`: measure each expert's saliency on a workload, keep the N most salient per
layer, save the smaller checkpoint, and compare it with the original.

Steps:
1. the original model: its quality (below), then the workload's sessions driven through it with
   a `SaliencyCollector` installed. The engine is driven directly, not through the run
   machinery: every session's turn k goes in one batch (continuous batching as usual), each
   later turn carrying the engine's real replies, as the driver sends them; arrival times,
   think times and tool latencies are left out, since only what the routers see matters here;
2. the N experts per layer with the highest saliency kept (`engine.moe_prune`), the checkpoint
   loaded again from its source on the CPU, pruned and written as an HF folder with
   `pruning.json` (saliency, kept ids, the numbers below);
3. the pruned folder loaded: its quality, then the decode speed of both models.

Decode speed: one greedy request of `decode_tokens` tokens (after a short warm-up), tokens per
second over its decode steps; the original and the pruned model take turns DECODE_ROUNDS times
in one sitting (both loaded: twice the memory of one) and each reports its median. Quality:
`llmbench quality`'s texts and metrics — perplexity over windows of `context` tokens of the
first `eval_tokens` tokens of each text, and the pruned model's mean KL divergence from the
original's next-token distributions and top-1 agreement.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmbench.errors import UserError
from llmbench.harness import quality
from llmbench.harness.driver import turn_messages
from llmbench.harness.engine_config import engine_config
from llmbench.harness.spec import EngineSpec, RunSpec
from llmbench.harness.workloads import Tokens, build_sessions

if TYPE_CHECKING:  # the engine is imported lazily: `llmbench` runs without torch
    import torch

    from llmbench.engine.engine import LLMEngine

PRUNING_FILE = "pruning.json"
DECODE_ROUNDS = 3  # decode-speed requests per model, original and pruned in turn: the median
DECODE_PROMPT = quality.PROMPTS[0]


@dataclass(frozen=True)
class PruneSettings:
    model: str
    spec: RunSpec  # the workload (its engine block sizes the engine; `model` is replaced)
    keep: int  # experts per layer kept
    out: Path  # the pruned checkpoint's folder (new, or empty)
    dtype: str = "float32"  # the engines' dtype and the checkpoint's
    device: str = "auto"
    threads: int | None = None
    eval_tokens: int = 512  # tokens of each quality text scored
    context: int = 256  # tokens per scored window
    decode_tokens: int = 64  # greedy tokens of the decode-speed request


def prune(settings: PruneSettings, progress: Callable[[str], None]) -> dict[str, Any]:
    """Collect, prune, save, measure (module docstring); returns what `pruning.json` holds."""
    import torch

    from llmbench.engine import hf_writer, moe_prune
    from llmbench.engine.weights import open_weights

    check_out(settings.out)
    source = open_weights(settings.model)
    config = source.config
    if not config.is_moe:
        raise UserError(f"moe prune: {settings.model} has no experts (it is dense)")
    if settings.keep > config.num_experts:
        raise UserError(
            f"moe prune: --keep {settings.keep} is more than the model's {config.num_experts} "
            "experts per layer"
        )
    new_config = moe_prune.pruned_config(config, settings.keep)
    texts = quality.builtin_texts()
    engine = _engine(settings.model, settings)
    progress(f"moe prune: measuring {settings.model} before pruning")
    before, ref_log_probs = _measure(engine, settings, texts, None)
    progress(f"moe prune: collecting saliency on workload '{settings.spec.name}'")
    collector = moe_prune.SaliencyCollector(config.num_layers, config.num_experts, engine.device)
    collector.install(engine.model)
    t0 = time.perf_counter()
    num_requests, num_tokens = drive_workload(engine, settings.spec)
    collect_s = time.perf_counter() - t0
    moe_prune.SaliencyCollector.remove(engine.model)
    original = engine  # kept for the decode-speed comparison at the end
    scores = collector.saliency()
    kept = moe_prune.experts_to_keep(scores, settings.keep)
    weight_sum = collector.weight_sum.cpu()
    progress(f"moe prune: writing {settings.keep} of {config.num_experts} experts per layer")
    tensors = source.load(_torch_dtype(settings.dtype), torch.device("cpu"))
    pruned = moe_prune.prune_tensors(tensors, config, kept)
    del tensors
    folder = getattr(source, "folder", None)
    source_json = json.loads((folder / "config.json").read_text()) if folder else None
    hf_writer.write_folder(
        settings.out,
        hf_writer.hf_config(new_config, source_json),
        pruned,
        source.tokenizer(),
        tokenizer_source=folder,
    )
    del pruned
    engine = _engine(str(settings.out), settings)
    if engine.model_config.num_experts != settings.keep:
        raise RuntimeError("the pruned checkpoint did not load with the kept expert count")
    progress(f"moe prune: measuring {settings.out} after pruning")
    after, _ = _measure(engine, settings, texts, ref_log_probs)
    progress("moe prune: decode speed, before and after in turn")
    n = settings.decode_tokens
    speeds = [
        (decode_tok_per_s(original, n), decode_tok_per_s(engine, n)) for _ in range(DECODE_ROUNDS)
    ]
    before["decode_tok_per_s"] = statistics.median(b for b, _ in speeds)
    after["decode_tok_per_s"] = statistics.median(a for _, a in speeds)
    del engine, original
    itemsize = _torch_dtype(settings.dtype).itemsize
    before["num_params"], after["num_params"] = config.num_params(), new_config.num_params()
    before["weight_bytes"] = config.num_params() * itemsize
    after["weight_bytes"] = new_config.num_params() * itemsize
    after["checkpoint_bytes"] = (settings.out / "model.safetensors").stat().st_size
    result = {
        "model": settings.model,
        "out": str(settings.out),
        "dtype": settings.dtype,
        "workload": settings.spec.name,
        "num_requests": num_requests,
        "num_tokens": num_tokens,
        "num_tokens_routed": int(collector.num_rows[0]),
        "collect_s": collect_s,
        "num_experts": config.num_experts,
        "keep": settings.keep,
        "top_k": config.num_experts_per_tok,
        "router": f"{config.router_scoring}, top-k renormalised: {config.norm_topk_prob}",
        "pruned_weight_share": moe_prune.pruned_weight_share(weight_sum, kept),
        "kept": kept,
        "saliency": scores.tolist(),
        "tokens_routed": collector.tokens.cpu().tolist(),
        "quality_texts": [
            {"name": t.name, "source": t.source, "num_tokens": settings.eval_tokens} for t in texts
        ],
        "context": settings.context,
        "decode_tokens": settings.decode_tokens,
        "before": before,
        "after": after,
    }
    (settings.out / PRUNING_FILE).write_text(json.dumps(result, indent=1) + "\n")
    return result


def check_out(out: Path) -> None:
    """The output folder must be new or empty: checked before any work."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty folder; give a new one")


def drive_workload(engine: LLMEngine, spec: RunSpec) -> tuple[int, int]:
    """Every session of the workload through `engine`, turn by turn (module docstring);
    returns (requests, prompt + generated tokens)."""
    from llmbench.engine.sampling import SamplingParams

    tok = engine.tokenizer
    sessions = build_sessions(spec.workload, spec.seed, Tokens(tok.encode, tok.decode))
    histories = [[{"role": "system", "content": s.system_prompt}] for s in sessions]
    replies: list[str | None] = [None] * len(sessions)
    num_requests = num_tokens = 0
    for turn_index in range(max(len(s.turns) for s in sessions)):
        active = [i for i, s in enumerate(sessions) if turn_index < len(s.turns)]
        prompts, params = [], []
        for i in active:
            turn = sessions[i].turns[turn_index]
            histories[i] += turn_messages(turn, replies[i])
            tools = list(sessions[i].tools) if sessions[i].tools else None
            prompts.append(tok.encode_chat(histories[i], tools=tools))
            params.append(
                SamplingParams(
                    max_tokens=turn.max_tokens,
                    temperature=spec.temperature,
                    ignore_eos=spec.ignore_eos,
                    seed=spec.seed + i,
                )
            )
        outputs = engine.generate(prompts, params)
        for i, prompt, out in zip(active, prompts, outputs, strict=True):
            replies[i] = tok.decode(out, skip_special_tokens=True)
            num_tokens += len(prompt) + len(out)
        num_requests += len(active)
    return num_requests, num_tokens


def decode_tok_per_s(engine: LLMEngine, num_tokens: int) -> float:
    """Greedy decode speed of one request alone (a short warm-up request first).

    Formula: decode steps / Σ their (t_end − t_start), over the measured request's steps.
    """
    from llmbench.engine.sampling import SamplingParams

    prompt = engine.tokenizer.encode(DECODE_PROMPT)
    engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    engine.step_records.clear()
    greedy = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    engine.generate([prompt], greedy)
    decode = [r for r in engine.step_records if r.num_prefill_tokens == 0]
    seconds = sum(r.t_end_ns - r.t_start_ns for r in decode) / 1e9
    return len(decode) / seconds if seconds else 0.0


def _measure(
    engine: LLMEngine,
    settings: PruneSettings,
    texts: Sequence[quality.EvalText],
    ref_log_probs: list[torch.Tensor] | None,
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """Quality of one engine; KL and top-1 agreement against `ref_log_probs`
    (the original's, window by window) when given. Returns the numbers and its log-probs."""
    import torch

    log_probs_all, nll_sum, kl_sum, agree, scored = [], 0.0, 0.0, 0, 0
    for text in texts:
        ids = engine.tokenizer.encode(text.text)
        for window in quality.windows(ids, settings.context, settings.eval_tokens):
            log_probs = quality.next_token_log_probs(engine.score(window))
            targets = torch.tensor(window[1:], device=log_probs.device)
            nll_sum += quality.nll(log_probs, targets).sum().item()
            scored += len(targets)
            if ref_log_probs is not None:
                ref = ref_log_probs[len(log_probs_all)]
                kl_sum += quality.kl_divergence(ref, log_probs).sum().item()
                agree += int((ref.argmax(-1) == log_probs.argmax(-1)).sum())
            log_probs_all.append(log_probs)
    if not scored:
        raise UserError("moe prune: the evaluation texts have fewer than 2 tokens")
    numbers: dict[str, Any] = {
        "perplexity": quality.perplexity(nll_sum, scored),
        "num_tokens_scored": scored,
    }
    if ref_log_probs is not None:
        numbers["mean_kl"] = kl_sum / scored
        numbers["top1_agreement"] = agree / scored
    return numbers, log_probs_all


def _engine(model: str, settings: PruneSettings) -> LLMEngine:
    """An engine sized by the workload's engine block; its weights and K/V cache as loaded (the
    block's quantisation, K/V formats, speculation and offloading are not the study's)."""
    from llmbench.engine.engine import LLMEngine

    e = settings.spec.engine
    sized_only = EngineSpec(
        block_size=e.block_size,
        max_num_batched_tokens=e.max_num_batched_tokens,
        max_num_seqs=e.max_num_seqs,
        prefix_caching=e.prefix_caching,
        kv_cache_memory=e.kv_cache_memory,
        threads=settings.threads or e.threads,
    )
    return LLMEngine(engine_config(model, settings.dtype, settings.device, sized_only))


def _torch_dtype(name: str) -> torch.dtype:
    from llmbench.engine.engine import parse_dtype

    return parse_dtype(name)


def format_report(result: dict[str, Any]) -> str:
    """The before/after table of a `prune` result."""
    b, a = result["before"], result["after"]
    mib = 2**20

    def row(label: str, before: str, after: str) -> str:
        return f"{label:<26}{before:>16}{after:>16}"

    lines = [
        f"llmbench moe prune: {result['model']} -> {result['out']} ({result['dtype']}), "
        f"{result['keep']} of {result['num_experts']} experts per layer kept "
        f"(top-{result['top_k']})",
        f"saliency from workload '{result['workload']}': {result['num_requests']} requests, "
        f"{result['num_tokens']:,} prompt + output tokens ({result['num_tokens_routed']:,} ran "
        f"through the routers) in {result['collect_s']:.1f} s; routing weight on the pruned "
        f"experts: {result['pruned_weight_share']:.1%}",
        row("", "before", "after"),
        row("parameters", f"{b['num_params']:,}", f"{a['num_params']:,}"),
        row(
            f"weights ({result['dtype']}, MiB)",
            f"{b['weight_bytes'] / mib:,.1f}",
            f"{a['weight_bytes'] / mib:,.1f}",
        ),
        row(
            "decode tok/s (batch 1)", f"{b['decode_tok_per_s']:.1f}", f"{a['decode_tok_per_s']:.1f}"
        ),
        row("perplexity", f"{b['perplexity']:.3f}", f"{a['perplexity']:.3f}"),
        row("mean KL vs before (nats)", "", f"{a['mean_kl']:.3g}"),
        row("top-1 agreement", "", f"{a['top1_agreement']:.1%}"),
        f"quality: {b['num_tokens_scored']:,} tokens of "
        + ", ".join(t["name"] for t in result["quality_texts"])
        + f" in windows of {result['context']}; decode: {result['decode_tokens']} greedy tokens",
    ]
    return "\n".join(lines)
