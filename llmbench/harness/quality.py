"""What quantising the weights or the K/V cache costs in quality, measured on the engine itself.

Every configuration (weight quantisation × K/V cache formats) scores the same token windows with
the engine's own forward pass through its paged cache (`LLMEngine.score`), and generates greedily
from the same prompts. The reference is the unquantised model (weights as loaded, K/V in the
model's dtype): always the first row. Per configuration:

- perplexity: exp(mean NLL of each next token) over non-overlapping windows of `context`
  tokens, each scored from an empty cache (a window's first token is context only);
- mean KL(P_ref ‖ P) of the next-token distributions at the same positions;
- top-1 agreement: the share of those positions where both argmaxes agree;
- greedy agreement: the share of `generate` greedy tokens per prompt made before the first one
  that differs from the reference's, averaged over the prompts.

The evaluation texts need no download: the English prose of the standard library's
`pydoc_data.topics` (the language reference's topics, sorted by name, joined by blank lines) and
the source of a few pure-Python standard-library modules (SOURCE_MODULES, in that order); each
is cut to its first `num_tokens` tokens. They change with the Python version, so a result
records each text's sha256 and Python's version. A user's `--text FILE` replaces both.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmbench.errors import UserError
from llmbench.harness.engine_config import engine_config
from llmbench.harness.engine_config import kv_cache_dtype as engine_kv_cache_dtype
from llmbench.harness.spec import EngineSpec, KVCacheDtypeSpec

if TYPE_CHECKING:  # the engine is imported lazily: `llmbench` runs without torch
    import torch

    from llmbench.engine.engine import LLMEngine
    from llmbench.engine.kv_dtype import KVCacheDtype
    from llmbench.harness.spec import RunSpec

SOURCE_MODULES = ("textwrap", "fractions", "shlex", "heapq")
# Greedy prompts: prose, code, and a question; plain text (no chat template).
PROMPTS = (
    "The Python language reference describes the syntax and",
    "def binary_search(items, target):\n",
    "Question: Why is the sky blue?\nAnswer:",
)
# Reference log-probabilities are kept in memory (float32, one row per scored token).
MAX_REFERENCE_BYTES = 4 * 1024**3


@dataclass(frozen=True)
class EvalText:
    name: str
    source: str  # where the text came from, for the record
    text: str


@dataclass(frozen=True)
class QualityConfig:
    """One row: weight quantisation (`EngineConfig.quantize`; None: as loaded) and K/V formats."""

    quantize: str | None
    kv_cache_dtype: KVCacheDtype

    @property
    def is_reference(self) -> bool:
        return self.quantize is None and self.kv_cache_dtype.k == self.kv_cache_dtype.v == "auto"


@dataclass(frozen=True)
class QualitySettings:
    model: str
    dtype: str = "float32"
    device: str = "auto"
    threads: int | None = None
    context: int = 512  # tokens per scored window
    num_tokens: int = 1024  # tokens of each text scored: its first ones
    generate: int = 32  # greedy tokens per prompt
    block_size: int = 16


@dataclass
class Totals:
    """Sums over the scored positions of one text (or all texts)."""

    num_tokens: int = 0
    nll: float = 0.0
    kl: float = 0.0
    num_top1_agree: int = 0

    def add(self, other: Totals) -> None:
        self.num_tokens += other.num_tokens
        self.nll += other.nll
        self.kl += other.kl
        self.num_top1_agree += other.num_top1_agree


# -- texts ------------------------------------------------------------------------------------


def builtin_texts() -> list[EvalText]:
    """The two evaluation texts every Python install has (module docstring)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise UserError(
            "quality: this Python has no pydoc_data (the standard library's help topics); "
            "give an evaluation text with --text FILE"
        ) from None
    prose = "\n\n".join(topics[name] for name in sorted(topics))
    sources = []
    for module in SOURCE_MODULES:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            raise UserError(f"quality: the standard library's {module}.py is not on this Python")
        sources.append(Path(spec.origin).read_text())
    version = platform.python_version()
    return [
        EvalText("pydoc-topics", f"pydoc_data.topics of Python {version}, sorted by name", prose),
        EvalText(
            "stdlib-source",
            f"{', '.join(m + '.py' for m in SOURCE_MODULES)} of Python {version}",
            "\n\n".join(sources),
        ),
    ]


def file_text(path: Path) -> EvalText:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--text {path}: cannot read it as text ({e}); give a UTF-8 file") from None
    return EvalText(path.name, str(path), text)


def windows(token_ids: Sequence[int], context: int, num_tokens: int) -> list[list[int]]:
    """The first num_tokens tokens cut into windows of `context` (the last may be shorter; one
    of fewer than 2 tokens scores nothing and is dropped)."""
    ids = list(token_ids[:num_tokens])
    cut = [ids[i : i + context] for i in range(0, len(ids), context)]
    return [w for w in cut if len(w) >= 2]


# -- metrics ----------------------------------------------------------------------------------


def next_token_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """logits [n, V] of a window (row i predicts token i + 1) → log-probabilities [n - 1, V]
    of the rows that have a next token in the window."""
    import torch

    return torch.log_softmax(logits[:-1].float(), dim=-1)


def nll(log_probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of each target [n] under log_probs [n, V]: −log p(target)."""
    return -log_probs.gather(1, targets[:, None])[:, 0]


def kl_divergence(ref_log_probs: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """KL(P_ref ‖ P) per row [n], in nats.

    Formula: Σ_v p_ref(v) · (log p_ref(v) − log p(v)).
    """
    return (ref_log_probs.exp() * (ref_log_probs - log_probs)).sum(-1)


def perplexity(nll_sum: float, num_tokens: int) -> float:
    """Formula: exp(Σ NLL / number of scored tokens)."""
    return math.exp(nll_sum / num_tokens)


def greedy_agreement(reference: Sequence[int], tokens: Sequence[int]) -> float:
    """Share of the reference's greedy tokens reproduced before the first difference.

    Formula: (length of the common prefix of both token lists) / len(reference).
    """
    same = 0
    for a, b in zip(reference, tokens, strict=False):  # a shorter list ends the prefix
        if a != b:
            break
        same += 1
    return same / len(reference) if reference else 1.0


# -- the run ----------------------------------------------------------------------------------


def configurations(
    quantize: Sequence[str | None], kv_cache_dtypes: Sequence[KVCacheDtype]
) -> list[QualityConfig]:
    """Every weight quantisation with every K/V format (the cartesian product), the reference
    first and once."""
    from llmbench.engine.kv_dtype import KVCacheDtype

    configs = [QualityConfig(None, KVCacheDtype())]
    for q in quantize:
        for kv in kv_cache_dtypes:
            config = QualityConfig(q, kv)
            if config not in configs:
                configs.append(config)
    return configs


def run_quality(
    settings: QualitySettings,
    configs: Sequence[QualityConfig],
    texts: Sequence[EvalText],
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Score `texts` and generate from PROMPTS under every configuration (the first must be
    the reference); returns the result as plain JSON values (`format_table` prints it)."""
    import torch

    from llmbench.engine.kv_cache import blocks_for
    from llmbench.engine.sampling import SamplingParams
    from llmbench.engine.weights import open_weights

    if not configs or not configs[0].is_reference:
        raise ValueError("the first configuration must be the reference")
    source = open_weights(settings.model)
    tokenizer = source.tokenizer()
    window_sets, text_info = {}, []
    for text in texts:
        ids = tokenizer.encode(text.text)
        window_sets[text.name] = windows(ids, settings.context, settings.num_tokens)
        text_info.append(
            {
                "name": text.name,
                "source": text.source,
                "sha256": hashlib.sha256(text.text.encode()).hexdigest()[:16],
                "num_tokens_total": len(ids),
                "num_tokens": min(len(ids), settings.num_tokens),
                "num_tokens_scored": sum(len(w) - 1 for w in window_sets[text.name]),
            }
        )
    _check_reference_memory(window_sets, source.config.vocab_size)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    # One window at a time, or every prompt with its greedy tokens at once.
    num_blocks = max(
        blocks_for(settings.context, settings.block_size),
        sum(blocks_for(len(p) + settings.generate, settings.block_size) for p in prompt_ids),
    )
    greedy = (  # --generate 0: no greedy tokens, no agreement column
        SamplingParams(max_tokens=settings.generate, temperature=0.0, ignore_eos=True)
        if settings.generate
        else None
    )
    reference: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    ref_tokens: list[list[int]] = []
    rows = []
    for number, config in enumerate(configs):
        t0 = time.perf_counter()
        engine = _open_engine(settings, config, source.config, num_blocks)
        kv = engine.kv_cache.kv_dtype
        label = f"weights {config.quantize or 'as loaded'}, kv {kv.label}"
        progress(f"quality: {number + 1}/{len(configs)} {label}")
        by_text: dict[str, Totals] = {}
        for text_name, text_windows in window_sets.items():
            totals = by_text[text_name] = Totals()
            for i, window in enumerate(text_windows):
                log_probs = next_token_log_probs(engine.score(window))
                targets = torch.tensor(window[1:], device=log_probs.device)
                if number == 0:
                    reference.setdefault(text_name, []).append((log_probs, log_probs.argmax(-1)))
                ref_log_probs, ref_top1 = reference[text_name][i]
                totals.add(
                    Totals(
                        num_tokens=len(targets),
                        nll=nll(log_probs, targets).sum().item(),
                        kl=kl_divergence(ref_log_probs, log_probs).sum().item(),
                        num_top1_agree=int((log_probs.argmax(-1) == ref_top1).sum()),
                    )
                )
        tokens = engine.generate(prompt_ids, greedy) if greedy else []
        if number == 0:
            ref_tokens = tokens
        rows.append(_row(config, engine, by_text, ref_tokens, tokens, time.perf_counter() - t0))
        del engine
    return {
        "model": settings.model,
        "dtype": settings.dtype,
        "device": settings.device,
        "python": platform.python_version(),
        "context": settings.context,
        "num_tokens_per_text": settings.num_tokens,
        "generate": settings.generate,
        "texts": text_info,
        "prompts": list(PROMPTS),
        "rows": rows,
    }


def _open_engine(
    settings: QualitySettings, config: QualityConfig, model_config: Any, num_blocks: int
) -> LLMEngine:
    """An engine for one configuration, its K/V cache exactly `num_blocks` blocks."""
    from llmbench.engine.engine import LLMEngine, parse_dtype
    from llmbench.engine.kv_dtype import bytes_per_token

    mc = model_config
    per_token = bytes_per_token(
        mc.num_layers,
        mc.num_kv_heads,
        mc.head_dim,
        config.kv_cache_dtype,
        parse_dtype(settings.dtype).itemsize,
    )
    engine = EngineSpec(
        block_size=settings.block_size,
        max_num_seqs=len(PROMPTS),
        threads=settings.threads,
        kv_cache_dtype=KVCacheDtypeSpec(config.kv_cache_dtype.k, config.kv_cache_dtype.v),
        quantize=config.quantize,
    )
    exact = float(num_blocks * settings.block_size * per_token)
    config = engine_config(settings.model, settings.dtype, settings.device, engine)
    return LLMEngine(replace(config, kv_cache_memory=exact))


def of_run(spec: RunSpec, progress: Callable[[str], None]) -> dict[str, Any]:
    """A run's `quality` block (`RunSpec.quality`): the run's engine configuration (weight
    quantisation, K/V formats) against the unquantised model, as `run_quality` gives it."""
    q, e = spec.quality, spec.engine
    kv_cache_dtype = engine_kv_cache_dtype(e.kv_cache_dtype)
    settings = QualitySettings(
        model=spec.model,
        dtype=spec.dtype,
        device=spec.device,
        threads=e.threads,
        context=q.context,
        num_tokens=q.tokens,
        generate=q.generate,
        block_size=e.block_size,
    )
    texts = builtin_texts() if q.text is None else [file_text(Path(q.text))]
    configs = configurations([e.quantize], [kv_cache_dtype])
    return run_quality(settings, configs, texts, progress)


def _check_reference_memory(window_sets: dict[str, list[list[int]]], vocab_size: int) -> None:
    scored = sum(len(w) - 1 for ws in window_sets.values() for w in ws)
    if scored == 0:
        raise UserError("quality: the evaluation text has fewer than 2 tokens; nothing to score")
    needed = scored * vocab_size * 4
    if needed > MAX_REFERENCE_BYTES:
        raise UserError(
            f"quality: {scored:,} scored tokens x {vocab_size:,} vocabulary need "
            f"{needed / 2**30:.1f} GiB for the reference's distributions (at most "
            f"{MAX_REFERENCE_BYTES / 2**30:.0f}); lower --tokens"
        )


def _row(
    config: QualityConfig,
    engine: LLMEngine,
    by_text: dict[str, Totals],
    ref_tokens: list[list[int]],
    tokens: list[list[int]],
    seconds: float,
) -> dict[str, Any]:
    kv = engine.kv_cache.kv_dtype
    total = Totals()
    for totals in by_text.values():
        total.add(totals)
    agreements = [greedy_agreement(r, t) for r, t in zip(ref_tokens, tokens, strict=True)]
    return {
        "weights": config.quantize,
        "kv_cache_dtype": {"k": kv.k, "v": kv.v},
        "kv_bytes_per_token": engine.kv_cache.bytes_per_token,
        "is_reference": config.is_reference,
        "num_tokens_scored": total.num_tokens,
        "perplexity": perplexity(total.nll, total.num_tokens),
        "perplexity_by_text": {
            name: perplexity(t.nll, t.num_tokens) for name, t in by_text.items() if t.num_tokens
        },
        "mean_kl": total.kl / total.num_tokens,
        "top1_agreement": total.num_top1_agree / total.num_tokens,
        "greedy_agreement": sum(agreements) / len(agreements) if agreements else None,
        "seconds": seconds,
    }


def format_table(result: dict[str, Any]) -> str:
    """The result as an aligned table, one row per configuration, the reference first."""
    texts = result["texts"]
    scored = sum(t["num_tokens_scored"] for t in texts)
    header = (
        f"llmbench quality: {result['model']} {result['dtype']}; "
        + ", ".join(f"{t['name']} {t['num_tokens']:,} tokens" for t in texts)
        + f" in windows of {result['context']} ({scored:,} scored); "
        f"{len(result['prompts'])} prompts x {result['generate']} greedy tokens"
    )
    names = [t["name"] for t in texts]
    columns = ["weights", "kv cache", "KV B/token", "ppl"]
    columns += [f"ppl {n}" for n in names] + ["mean KL", "top-1", "greedy", "s"]
    table = []
    for row in result["rows"]:
        kv = row["kv_cache_dtype"]
        greedy = row["greedy_agreement"]
        table.append(
            [
                row["weights"] or "as loaded",
                kv["k"] if kv["k"] == kv["v"] else f"k={kv['k']},v={kv['v']}",
                f"{row['kv_bytes_per_token']:,}",
                f"{row['perplexity']:.3f}",
                *(f"{row['perplexity_by_text'].get(n, math.nan):.3f}" for n in names),
                f"{row['mean_kl']:.5f}",
                f"{row['top1_agreement']:.3f}",
                "-" if greedy is None else f"{greedy:.3f}",
                f"{row['seconds']:.1f}",
            ]
        )
    widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(columns)]

    def line(cells: list[str]) -> str:
        first = [cells[0].ljust(widths[0]), cells[1].ljust(widths[1])]
        rest = [c.rjust(w) for c, w in zip(cells[2:], widths[2:], strict=True)]
        return "  ".join(first + rest).rstrip()

    return "\n".join([header, line(columns), *(line(r) for r in table)])
