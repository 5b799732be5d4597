"""Per-request sampling: settings, the batched sampler and finish decisions.

The engine's forward pass ends in logits `[B, V]`, one row per running request. `sample` turns
them into one token id per row, honouring each row's own `SamplingParams` and `torch.Generator`
(so a seeded request draws the same tokens whatever else is in the batch). After the token is
detokenized, `detokenizer.StopStringMatcher` decides what text may be streamed and
`check_stop` decides whether the request is finished.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

import torch

from llmbench.engine.host_to_device import to_device
from llmbench.errors import UserError

# top_k travels to the device as int64: a larger one overflowed there and stopped the engine
# thread (`top_k: 1e30` in a request); any k past the vocabulary already means "off".
MAX_TOP_K = 2**31 - 1


@dataclass(frozen=True)
class SamplingParams:
    """Generation settings of one request (vLLM's names and meanings).

    `logit_bias` is added to the logits first; then the filters apply in this order:
    temperature, top-k, top-p, min-p. `temperature == 0` means greedy decoding (the argmax of
    the biased logits), in which case the filters and `seed` are ignored.
    """

    max_tokens: int = 16
    """Most tokens to generate (>= 1); reaching it finishes the request with reason "length"."""
    temperature: float = 1.0
    """Logits are divided by it before softmax (>= 0; 0 means greedy argmax)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability sums to >= top_p (0, 1]."""
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the most likely token's probability [0, 1]."""
    seed: int | None = None
    """Seed of the request's own generator; None draws one from torch's global RNG."""
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends before the first occurrence, which is not emitted."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end generation like EOS (the token itself is generated)."""
    ignore_eos: bool = False
    """Keep generating past the model's EOS tokens (benchmarks use it to fix output length)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to those tokens' logits before anything else, sorted by id;
    a mapping {id: bias} is accepted and stored this way. Bias in [-100, 100] as in OpenAI's
    API: -100 bans a token in practice, +100 forces it. The engine checks the ids against the
    model's vocabulary, which these settings do not know."""

    def __post_init__(self) -> None:
        # Lists (from YAML/JSON) become tuples so the dataclass stays hashable and immutable;
        # a lone string is one stop string, not a sequence of one-character stop strings.
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))

        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            _reject("max_tokens", self.max_tokens, "must be an integer >= 1")
        if not _is_real(self.temperature) or not self.temperature >= 0:
            _reject("temperature", self.temperature, "must be >= 0")
        if not _is_int(self.top_k) or not 0 <= self.top_k <= MAX_TOP_K:
            _reject("top_k", self.top_k, f"must be 0 (off) or an integer in [1, {MAX_TOP_K}]")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            _reject("top_p", self.top_p, "must be in (0, 1]")
        if not _is_real(self.min_p) or not 0 <= self.min_p <= 1:
            _reject("min_p", self.min_p, "must be in [0, 1]")
        if self.seed is not None and not _is_int(self.seed):
            _reject("seed", self.seed, "must be an integer or null")
        for s in stop:
            if not isinstance(s, str) or not s:
                _reject("stop", s, "entries must be non-empty strings")
        for token_id in self.stop_token_ids:
            if not _is_int(token_id) or token_id < 0:
                _reject("stop_token_ids", token_id, "entries must be integers >= 0")
        if not isinstance(self.ignore_eos, bool):
            _reject("ignore_eos", self.ignore_eos, "must be true or false")

    @property
    def is_greedy(self) -> bool:
        """True when the next token is the argmax of the logits (temperature 0)."""
        return self.temperature == 0


def _is_int(value: object) -> bool:
    # bool is an int subclass, but `top_k: true` in a YAML file is a mistake, not 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    # NaN and inf fail every range check below only by accident; reject them by name.
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _reject(field: str, value: object, allowed: str) -> NoReturn:
    raise UserError(f"sampling: {field} {allowed}, got {value!r}")


def _bias_pairs(bias: object) -> tuple[tuple[int, float], ...]:
    """`logit_bias` as checked (id, bias) pairs sorted by id, from a mapping or pairs."""
    pairs = bias.items() if isinstance(bias, Mapping) else bias
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
        _reject("logit_bias", bias, "must be a mapping of token id to bias")
    pairs = tuple(pairs)
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            _reject("logit_bias", bias, "must be a mapping of token id to bias")
        token_id, value = pair
        if not _is_int(token_id) or token_id < 0:
            _reject("logit_bias", token_id, "keys must be token ids (integers >= 0)")
        if not _is_real(value) or not -100 <= value <= 100:
            _reject("logit_bias", value, "values must be in [-100, 100]")
    token_ids = [token_id for token_id, _ in pairs]
    if len(set(token_ids)) != len(token_ids):
        _reject("logit_bias", token_ids, "must name each token id once")
    return tuple(sorted(pairs))


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """Create a request's generator once, at admission; `sample` then draws from it every step.

    An unseeded request gets a seed drawn from torch's global RNG, so it still samples, and a run
    that calls `torch.manual_seed` up front is reproducible end to end. `device` must be the
    device the logits live on (torch refuses a CPU generator for CUDA tensors).
    """
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """Pick one token per row: argmax for greedy rows, a filtered random draw for the others.

    logits: `[B, V]`, any float dtype (the maths runs in float32). `params[i]` and
    `generators[i]` belong to row i; a greedy row's generator is unused, and a sampled row with
    generator None draws from torch's global RNG. Returns `[B]` int64 token ids, on the
    logits' device: nothing here waits for the device (no `.item()`, no blocking copy), so the
    caller's read of the ids is the step's one host sync.
    """
    batch_size = logits.shape[0]
    if len(params) != batch_size or len(generators) != batch_size:
        raise ValueError(
            f"sample: got {batch_size} logit rows, {len(params)} params, "
            f"{len(generators)} generators"
        )
    # Greedy decoding is the common benchmark setting: one argmax, no sort, no softmax.
    # argmax is exact in any dtype, so it skips the float32 copy too (unless a row has a bias).
    token_ids = greedy_ids(apply_logit_bias(logits, params))  # [B]
    sampled_rows = [i for i, p in enumerate(params) if not p.is_greedy]
    if not sampled_rows:
        return token_ids

    for i in sampled_rows:
        generator = generators[i]
        if generator is not None and generator.device != logits.device:
            # torch's own error is cryptic; this one says where the generator should come from.
            raise ValueError(
                f"sample: row {i}'s generator is on {generator.device} but the logits are on "
                f"{logits.device}; create it with make_generator(seed, device=logits.device)"
            )
    rows = to_device(sampled_rows, logits.device)  # no host sync on CUDA
    probs = sampling_probs(logits[rows], [params[i] for i in sampled_rows])  # [S, V]
    for j, i in enumerate(sampled_rows):
        # One multinomial per row because each request has its own generator. The id is written
        # on the device, with no .item(), so the loop adds no host read of its own.
        token_ids[i] = torch.multinomial(probs[j], 1, generator=generators[i])[0]
    return token_ids


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """The argmax of each row of `logits` [B, V]: [B] int64 on the logits' device, the first
    of equal maxima (a NaN counts as the largest), as torch's argmax.

    Float32 rows on a CPU go through numpy's argmax, which is vectorised: 3 against torch's
    78 µs for SmolLM2's 49,152 logits (a ~13 ms decode step).
    """
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(logits.numpy().argmax(axis=-1))
    return logits.argmax(dim=-1)


def apply_logit_bias(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """`logits` with each row's `logit_bias` added, in float32; the same tensor when no row has
    one (the common case costs nothing).

    Formula: out[i, t] = logits[i, t] + bias_i(t), bias_i(t) = 0 for ids row i does not name.
    logits: `[B, V]`; the ids must be < V (the engine checks them when a request arrives).
    """
    rows, cols, values = [], [], []
    for i, p in enumerate(params):
        for token_id, value in p.logit_bias:
            rows.append(i)
            cols.append(token_id)
            values.append(value)
    if not rows:
        return logits
    device = logits.device
    biased = logits.to(torch.float32, copy=True)  # bf16 would round a +0.5 bias away
    index = (to_device(rows, device), to_device(cols, device))
    bias = to_device(values, device, torch.float32)
    return biased.index_put_(index, bias, accumulate=True)


def sampling_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Probabilities `sample` draws from: softmax((logits + logit_bias) / T) after top-k, top-p
    and min-p.

    logits: `[S, V]` for non-greedy rows only, without their bias. Returns `[S, V]` float32;
    dropped tokens are exactly 0 and the kept ones are proportional to
    softmax((logits + logit_bias) / T) (min-p leaves the rows unnormalised, which
    `torch.multinomial` accepts).
    """
    device = logits.device
    temperature = to_device([p.temperature for p in params], device)
    x = apply_logit_bias(logits, params).float() / temperature[:, None]  # [S, V]

    # Sorting the vocabulary is the expensive step (V ~ 128k); skip it unless a row needs it.
    if any(p.top_k > 0 or p.top_p < 1 for p in params):
        top_k = to_device([p.top_k for p in params], device)
        top_p = to_device([p.top_p for p in params], device)
        x = x.masked_fill(_top_k_top_p_mask(x, top_k, top_p), -math.inf)

    probs = torch.softmax(x, dim=-1)  # [S, V]
    if any(p.min_p > 0 for p in params):
        # The ratio to the top probability is the same before and after top-k/top-p renormalise,
        # so filtering these probabilities is filtering the ones top-p left.
        min_p = to_device([p.min_p for p in params], device)
        threshold = min_p[:, None] * probs.amax(dim=-1, keepdim=True)  # [S, 1]
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


def _top_k_top_p_mask(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """True where top-k (0 = off) or top-p drops the token; x: `[S, V]`, returns `[S, V]` bool."""
    vocab_size = x.shape[-1]
    # Stable, so tied logits rank lowest id first, matching argmax's tie-break.
    sorted_x, sorted_ids = x.sort(dim=-1, descending=True, stable=True)  # [S, V] each
    rank = torch.arange(vocab_size, device=x.device)  # [V]
    k = torch.where(top_k > 0, top_k, vocab_size)  # [S]
    drop = rank[None, :] >= k[:, None]  # [S, V], in sorted order

    sorted_probs = torch.softmax(sorted_x.masked_fill(drop, -math.inf), dim=-1)
    # A token is kept while the tokens ranked above it sum to < top_p: this keeps the smallest
    # set reaching top_p, and always rank 0 (its prefix sum is 0 < top_p).
    cumulative = sorted_probs.cumsum(dim=-1)
    mass_above = torch.cat([torch.zeros_like(cumulative[:, :1]), cumulative[:, :-1]], dim=-1)
    # top_p == 1 is "off": float rounding could otherwise push mass_above to 1 and cut the tail.
    drop |= (mass_above >= top_p[:, None]) & (top_p[:, None] < 1)

    # Back to vocabulary order: sorted position j holds token sorted_ids[:, j].
    return torch.empty_like(drop).scatter_(-1, sorted_ids, drop)


def check_stop(
    token_id: int,
    num_generated: int,
    params: SamplingParams,
    eos_token_ids: Collection[int],
) -> str | None:
    """Finish reason after generating `token_id`, the `num_generated`-th output token, or None.

    "stop": the token is EOS (unless `ignore_eos`) or one of `stop_token_ids`; it takes
    precedence over "length": `num_generated >= max_tokens`. Stop strings are found by
    `StopStringMatcher` and also finish with "stop".
    """
    if token_id in params.stop_token_ids:
        return "stop"
    if not params.ignore_eos and token_id in eos_token_ids:
        return "stop"
    if num_generated >= params.max_tokens:
        return "length"
    return None
