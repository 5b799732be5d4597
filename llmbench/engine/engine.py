"""`LLMEngine`: load a model, accept requests, and step them to completion.

Each `step()` asks the scheduler for a batch, runs it as one forward pass, appends the sampled
tokens, checks stops, and returns a `RequestOutput` per request that advanced, stamped with
`perf_counter_ns()` once the tokens are on the host. A `StepRecord` per step goes to `on_step`
(when set: a run writes every one to disk) and into `step_records`, a window of the most recent
`STEP_RECORD_WINDOW` steps, so a server that runs for days keeps a bounded memory.
With speculative decoding on, a proposer first drafts up to k tokens for every decoding
sequence, and the same forward pass verifies them (`verification`): a step may then append
several tokens to a request, and never one past a stop.
"""

from __future__ import annotations

import collections
import itertools
import math
import queue
import time
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from llmbench.engine import huge_pages, spans
from llmbench.engine.checkpoint import check_tensors
from llmbench.engine.cuda_graphs import decode_graphs_for
from llmbench.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from llmbench.engine.draft_budget import DraftBudget
from llmbench.engine.expert_stats import ExpertStats
from llmbench.engine.huge_pages import PageReport, move_to_huge_pages
from llmbench.engine.kv_cache import BlockManager, blocks_for, blocks_in_budget
from llmbench.engine.kv_dtype import KVCacheDtype, bytes_per_token
from llmbench.engine.model import LlamaModel
from llmbench.engine.moe import mean_load_max_over_mean
from llmbench.engine.moe_offload import MoEOffloadConfig, offload_experts
from llmbench.engine.paged_attention import KVCache
from llmbench.engine.proposers import make_proposer
from llmbench.engine.quant.scheme import parse_quantize
from llmbench.engine.records import RequestOutput, StepRecord
from llmbench.engine.runner import ModelRunner
from llmbench.engine.sampling import SamplingParams, check_stop, make_generator
from llmbench.engine.scheduler import Scheduler, SchedulerConfig
from llmbench.engine.sequence import Sequence
from llmbench.engine.spans import span
from llmbench.engine.speculative import Proposer, SpeculativeConfig
from llmbench.engine.weights import open_weights
from llmbench.errors import UserError

_DEFAULT_CPU_KV_BYTES = 2 * 1024**3  # on a CPU, with no workload to size the cache from
# A workload's K/V cache holds its demand and this much more: room for the prefixes kept cached
# between a session's requests (a tool loop's next turn reuses them), speculative tokens and
# the chat template's own tokens beyond the estimate.
KV_HEADROOM = 1.25
# Steps kept in `LLMEngine.step_records`: minutes of decoding at ~100 steps/s, ~4 MB.
STEP_RECORD_WINDOW = 20_000


@dataclass(frozen=True)
class KVCacheDemand:
    """What a workload asks of the K/V cache at most: `num_seqs` sequences at once, each up to
    `max_tokens` tokens, prompt and output (None: up to the model's context window)."""

    num_seqs: int
    max_tokens: int | None


def kv_blocks_for(demand: KVCacheDemand, window: int, block_size: int) -> int:
    """K/V blocks for a workload's `demand` on a model with a `window`-token context, with
    `KV_HEADROOM`.

    Formula: ceil(KV_HEADROOM · num_seqs · ceil(min(max_tokens, window) / block_size)).
    The agentic main job on smollm2-135m: 4 sessions of up to 3,872 tokens, 16-token blocks:
    ceil(1.25 · 4 · 242) = 1,210 blocks, 19,360 tokens, 446 MB in bfloat16 (not 2 GiB).
    """
    max_tokens = window if demand.max_tokens is None else min(demand.max_tokens, window)
    return math.ceil(KV_HEADROOM * demand.num_seqs * blocks_for(max_tokens, block_size))


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2-135m"
    dtype: str = "float32"
    device: str = "auto"  # auto | cpu | cuda
    block_size: int = 16
    # KV cache size: bytes (> 1) or a fraction of free device memory (<= 1); None = default:
    # on a CPU what `kv_cache_demand` needs (`kv_blocks_for`), 2 GiB without one; on a GPU 90%
    # of what the weights leave free. Capped at what max_num_seqs full-length contexts use.
    kv_cache_memory: float | None = None
    # What the workload asks of the K/V cache (a run's `engine_config` says; None: unknown).
    kv_cache_demand: KVCacheDemand | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    enable_prefix_caching: bool = True
    num_threads: int | None = None  # CPU threads; None keeps torch's default
    # K/V cache storage, keys and values apart: auto (the model's dtype), a float dtype, int8
    # or int4 (a float16 scale per token and KV head); the cache holds as many more tokens.
    kv_cache_dtype: KVCacheDtype = KVCacheDtype()
    # Speculative decoding: off, n-gram prompt lookup, or a draft model (k tokens a step).
    speculative: SpeculativeConfig = SpeculativeConfig()
    # Weight-only quantization of every linear layer, done at load: None (the model's dtype),
    # int8 or int4[:group][:sym] (`quant.scheme`); embeddings and norms stay in `dtype`.
    quantize: str | None = None
    # MoE: N experts per layer resident, the others fetched over a host link (simulated by
    # bandwidth, or real copies on CUDA) through an LRU; None: every expert resident.
    moe_offload: MoEOffloadConfig | None = None
    # CUDA: replay plain decode steps from CUDA graphs, one per batch-size bucket, captured at
    # start (`cuda_graphs`); no effect on a CPU.
    cuda_graphs: bool = True
    # CPU: the weights and the K/V cache on 2 MiB pages where the OS gives them (`huge_pages`:
    # a decode step streams them faster); no effect on a GPU.
    huge_pages: bool = True

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise UserError(f"engine: block_size must be > 0, got {self.block_size}")
        if self.max_num_batched_tokens <= 0 or self.max_num_seqs <= 0:
            raise UserError("engine: max_num_batched_tokens and max_num_seqs must be > 0")
        if self.kv_cache_memory is not None and not self.kv_cache_memory > 0:
            raise UserError(
                "engine: kv_cache_memory must be > 0 (bytes, or up to 1: a fraction of free GPU "
                f"memory), got {self.kv_cache_memory}"
            )
        if self.num_threads is not None and self.num_threads < 1:
            raise UserError(f"engine: threads must be >= 1, got {self.num_threads}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise UserError(f"engine: device must be auto, cpu or cuda, got '{self.device}'")
        parse_quantize(self.quantize)  # a bad name is a one-line error before any loading


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise UserError(f"dtype '{name}': unsupported; use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("device 'cuda': no CUDA device is visible; use --device cpu")
    return torch.device(name)


class LLMEngine:
    def __init__(self, config: EngineConfig, proposer: Proposer | None = None):
        """`proposer`: drafts instead of the one `config.speculative` names, which is then not
        read (`llmbench profile --phase verify`'s fixed drafts: speculation is on whenever a
        proposer is)."""
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.device = resolve_device(config.device)
        self.dtype = parse_dtype(config.dtype)
        source = open_weights(config.model)
        self.source_description = source.description
        self.model_config = source.config
        self.tokenizer = source.tokenizer()
        t0 = time.perf_counter_ns()
        weights = source.load(self.dtype, self.device)
        check_tensors(weights, self.model_config, source.description)
        self.quantize = parse_quantize(config.quantize)
        self.model = LlamaModel(self.model_config, weights, self.quantize)
        del weights
        # Offloaded experts and their link traffic (None: every expert resident).
        self.moe_offload = (
            offload_experts(self.model, config.moe_offload, self.device)
            if config.moe_offload is not None
            else None
        )
        # Where the weights lie (None: not asked, or not a CPU): `huge_pages`.
        self.weight_pages: PageReport | None = None
        on_huge_pages = config.huge_pages and self.device.type == "cpu"
        if on_huge_pages:
            self.weight_pages = move_to_huge_pages(self.model.tensors())
        self.load_ms = (time.perf_counter_ns() - t0) / 1e6
        num_kv_blocks, self.kv_cache_sizing = self._num_kv_blocks()
        self.kv_cache = KVCache(
            self.model_config.num_layers,
            num_kv_blocks,
            config.block_size,
            self.model_config.num_kv_heads,
            self.model_config.head_dim,
            self.dtype,
            self.device,
            config.kv_cache_dtype,
            huge_pages.zeros if on_huge_pages else None,
        )
        self.blocks = BlockManager(
            self.kv_cache.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_batched_tokens, config.max_num_seqs), self.blocks
        )
        decode_graphs, graphs_line = decode_graphs_for(
            self.model, self.kv_cache, config.max_num_seqs, config.cuda_graphs
        )
        if graphs_line is not None:  # CUDA only: the run records them with its kernels
            self.model.kernels_description += f"; {graphs_line}"
        self.runner = ModelRunner(self.model, self.kv_cache, decode_graphs)
        # Guesses k tokens ahead before each step (None: speculation off).
        self.proposer = (
            proposer
            if proposer is not None
            else make_proposer(
                config.speculative,
                self.model,
                self.tokenizer,
                config.model,
                self.kv_cache,
                self.blocks,
                config.max_num_batched_tokens,
            )
        )
        # The draft model's shape, for the cost model (None: no draft model runs).
        self.draft_model_config = getattr(self.proposer, "model_config", None)
        # Speculation's adaptive draft length (None: every proposed draft is verified).
        self.draft_budget = (
            DraftBudget()
            if proposer is None and self.proposer is not None and config.speculative.adaptive
            else None
        )
        self.step_records: collections.deque[StepRecord] = collections.deque(
            maxlen=STEP_RECORD_WINDOW
        )
        # What the MoE routers chose, per phase, layer and expert (None for a dense model).
        mc = self.model_config
        self.expert_stats = (
            ExpertStats(mc.num_layers, mc.num_experts, mc.num_experts_per_tok, self.device)
            if mc.is_moe
            else None
        )
        # Called with every StepRecord, on the thread that steps (None: nobody listens).
        self.on_step: Callable[[StepRecord], None] | None = None
        self._sequences: dict[str, Sequence] = {}
        self._ids = itertools.count()
        # add_request/abort may come from other threads (an HTTP server, an asyncio driver):
        # they only post here, and step() — on the engine's own thread — takes them in.
        self._new_requests: queue.SimpleQueue[Sequence] = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.num_prompt_tokens_admitted = 0
        self.num_cached_tokens_admitted = 0

    def _num_kv_blocks(self) -> tuple[int, str]:
        """The K/V cache's blocks, and how they were sized (for the run's output)."""
        cfg = self.config
        mc = self.model_config
        token_bytes = bytes_per_token(
            mc.num_layers, mc.num_kv_heads, mc.head_dim, cfg.kv_cache_dtype, self.dtype.itemsize
        )
        bytes_per_block = token_bytes * cfg.block_size
        window = mc.max_position_embeddings
        max_useful = cfg.max_num_seqs * blocks_for(window, cfg.block_size)
        budget = cfg.kv_cache_memory
        demand = cfg.kv_cache_demand
        if budget is None and self.device.type != "cuda" and demand is not None:
            seq_tokens = window if demand.max_tokens is None else min(demand.max_tokens, window)
            sizing = (
                f"sized for the workload: {demand.num_seqs} sequences of up to {seq_tokens:,} "
                f"tokens + {KV_HEADROOM - 1:.0%}; engine.kv_cache_memory sets it"
            )
            return min(kv_blocks_for(demand, window, cfg.block_size), max_useful), sizing
        if budget is None:
            if self.device.type == "cuda":
                budget = 0.9 * torch.cuda.mem_get_info(self.device)[0]
                sizing = "90% of free GPU memory"
            else:
                budget = _DEFAULT_CPU_KV_BYTES
                sizing = "the 2 GiB CPU default"
        elif budget <= 1:
            if self.device.type != "cuda":
                raise UserError("engine: a fractional kv_cache_memory needs a GPU; give bytes")
            sizing = f"engine.kv_cache_memory: {budget:.0%} of free GPU memory"
            budget = budget * torch.cuda.mem_get_info(self.device)[0]
        else:
            sizing = "engine.kv_cache_memory"
        num_blocks = min(blocks_in_budget(budget, token_bytes, cfg.block_size), max_useful)
        if num_blocks < 1:
            raise UserError(
                f"engine: kv_cache_memory {budget:.0f} bytes holds no block of "
                f"{bytes_per_block} bytes; raise it"
            )
        if num_blocks == max_useful:
            sizing += f", capped at {cfg.max_num_seqs} full {window:,}-token contexts"
        return num_blocks, sizing

    # -- requests -------------------------------------------------------------------------

    def add_request(
        self, prompt: str | Seq[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        """Queue a request (text is tokenized without a chat template); returns its id."""
        prompt_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids:
            raise UserError("request: the prompt is empty")
        max_context = self.model_config.max_position_embeddings
        if len(prompt_ids) + params.max_tokens > max_context:
            raise UserError(
                f"request: prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) "
                f"exceeds the model's context window of {max_context} tokens; shorten the prompt "
                f"or lower max_tokens"
            )
        blocks_needed = blocks_for(len(prompt_ids) + params.max_tokens, self.config.block_size)
        if blocks_needed > self.blocks.num_blocks:
            raise UserError(
                f"request: needs {blocks_needed} KV blocks, the cache has "
                f"{self.blocks.num_blocks}; raise kv_cache_memory or shorten the request"
            )
        vocab_size = self.model_config.vocab_size
        biased_ids = [token_id for token_id, _ in params.logit_bias if token_id >= vocab_size]
        if biased_ids:
            raise UserError(
                f"request: logit_bias token id {biased_ids[0]} is outside the vocabulary "
                f"[0, {vocab_size})"
            )
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
        if request_id in self._sequences:
            raise UserError(f"request: id '{request_id}' is already in use")
        seq = Sequence(
            request_id=request_id,
            prompt_ids=prompt_ids,
            params=params,
            generator=make_generator(params.seed, self.device),
            detokenizer=IncrementalDetokenizer(self.tokenizer),
            stop_matcher=StopStringMatcher(params.stop),
            arrival_ns=time.perf_counter_ns(),
        )
        self._sequences[request_id] = seq
        self._new_requests.put(seq)
        return request_id

    def abort(self, request_id: str) -> None:
        """Stop a request; the next step frees its blocks and reports it finished ("abort")."""
        self._aborts.put(request_id)

    def has_unfinished(self) -> bool:
        return (
            self.scheduler.has_unfinished()
            or not self._new_requests.empty()
            or not self._aborts.empty()
        )

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache between workloads (call on the stepping thread, between
        steps): False, and nothing changed, while a request is queued or running. The
        admitted-token counters stay: they count the engine's life, as a server's do."""
        if self.has_unfinished():
            return False
        return self.blocks.reset_prefix_cache()

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Formula: cached prompt tokens / prompt tokens, over requests admitted so far."""
        if self.num_prompt_tokens_admitted == 0:
            return 0.0
        return self.num_cached_tokens_admitted / self.num_prompt_tokens_admitted

    def _take_inbox(self) -> list[RequestOutput]:
        while not self._new_requests.empty():
            self.scheduler.add(self._new_requests.get())
        outputs = []
        while not self._aborts.empty():
            seq = self._sequences.pop(self._aborts.get(), None)
            if seq is None:
                continue  # finished already, or unknown
            seq.finish_reason = "abort"
            self.scheduler.finish(seq)
            outputs.append(self._output(seq, (), "", time.perf_counter_ns()))
        return outputs

    # -- stepping -------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one batch; returns the outputs of every request that advanced or was aborted."""
        outputs = self._take_inbox()
        t_start = time.perf_counter_ns()
        if self.moe_offload is not None:
            self.moe_offload.take_step()  # what `score` fetched between steps is no step's
        drafted, num_withheld = self._propose()
        draft_ns = time.perf_counter_ns() - t_start if self.proposer is not None else 0
        with span(spans.SCHEDULE):
            plan = self.scheduler.schedule()
        self.num_prompt_tokens_admitted += plan.num_prompt_tokens_admitted
        self.num_cached_tokens_admitted += plan.num_cached_tokens
        if not plan.scheduled:
            return outputs
        num_prefill_tokens = sum(
            item.num_new_tokens
            for item in plan.scheduled
            if item.seq.num_computed_tokens < item.seq.num_prompt_tokens
        )
        # What each sequence's queries attended, drafts included (read before counters move).
        context_lens = tuple(
            item.seq.num_computed_tokens + item.num_new_tokens for item in plan.scheduled
        )
        new_tokens = iter(self.runner.execute(plan.scheduled))
        t_end = time.perf_counter_ns()  # tokens are on the host: the step is done
        with span(spans.OUTPUTS):
            routing = self.model.last_routing  # per MoE layer (empty for a dense model)
            link_bytes, link_s = (
                self.moe_offload.take_step() if self.moe_offload is not None else (0, 0.0)
            )
            if self.expert_stats is not None:
                self.expert_stats.add_step(
                    routing,
                    [it.num_new_tokens for it in plan.scheduled],
                    [
                        it.seq.num_computed_tokens < it.seq.num_prompt_tokens
                        for it in plan.scheduled
                    ],
                )
            num_decode_seqs = num_verify_seqs = num_proposed = num_accepted = 0
            for item in plan.scheduled:
                seq = item.seq
                num_drafts = len(item.spec_token_ids)
                num_known = item.num_new_tokens - num_drafts  # the sequence's own tokens run
                num_decode_seqs += (
                    num_known == 1 and seq.num_computed_tokens >= seq.num_prompt_tokens
                )
                if not seq.first_scheduled_ns:
                    seq.first_scheduled_ns = t_start
                needs_token = item.needs_logits  # read before the counter moves
                seq.num_computed_tokens += num_known
                if not needs_token:
                    self.blocks.cache_full_blocks(
                        seq.block_table, seq.token_ids, seq.num_computed_tokens, seq.prefix_ids
                    )
                    continue
                tokens = next(new_tokens)
                if num_drafts:
                    num_verify_seqs += 1
                    num_proposed += num_drafts
                    num_accepted += len(tokens) - 1
                    seq.num_proposed_tokens += num_drafts
                    seq.num_accepted_tokens += len(tokens) - 1
                    if self.draft_budget is not None:
                        self.draft_budget.observe_verify(seq, num_drafts, len(tokens) - 1)
                outputs.append(self._append_tokens(seq, tokens, t_end))
            if self.draft_budget is not None and num_prefill_tokens == 0:
                self.draft_budget.observe_step(
                    len(plan.scheduled), num_proposed, (t_end - t_start) / 1e9
                )
            for seq in drafted:
                seq.spec_token_ids, seq.spec_probs = [], None
                # Slots of rejected (or never verified) drafts lie past the computed count already;
                # give back the blocks that only they used.
                self.blocks.free_tail(seq.block_table, seq.num_tokens)
            record = StepRecord(
                t_start_ns=t_start,
                t_end_ns=t_end,
                num_prefill_tokens=num_prefill_tokens,
                num_decode_seqs=num_decode_seqs,
                context_lens=context_lens,
                query_lens=tuple(item.num_new_tokens for item in plan.scheduled),
                num_cached_tokens=plan.num_cached_tokens,
                num_blocks_used=self.blocks.num_used_blocks,
                num_blocks_total=self.blocks.num_blocks,
                num_preempted=plan.num_preempted,
                num_waiting=len(self.scheduler.waiting),
                num_proposed_tokens=num_proposed,
                num_accepted_tokens=num_accepted,
                num_verify_seqs=num_verify_seqs,
                num_withheld_tokens=num_withheld,
                draft_ns=draft_ns,
                draft_passes=self.proposer.draft_passes if drafted else (),
                experts_touched=tuple(r.num_experts_touched for r in routing),
                expert_load_max_over_mean=mean_load_max_over_mean(routing),
                link_bytes=link_bytes,
                link_s_simulated=link_s,
            )
            self.step_records.append(record)
        if self.on_step is not None:
            self.on_step(record)
        return outputs

    def _propose(self) -> tuple[list[Sequence], int]:
        """Draft tokens for every running sequence with one token left (speculation on), cut
        to what the draft budget keeps in a step of decodes only; returns those sequences and
        the drafts withheld."""
        if self.proposer is None:
            return [], 0
        running = self.scheduler.running
        seqs = [s for s in running if s.num_tokens - s.num_computed_tokens == 1]
        self.proposer.propose(seqs, running)
        # Beside a prompt's chunk (one waiting, or one mid-prompt) every draft runs.
        decode_only = not self.scheduler.waiting and len(seqs) == len(running)
        budget = self.draft_budget
        withheld = budget.trim(seqs) if budget is not None and decode_only else 0
        return seqs, withheld

    def _append_tokens(self, seq: Sequence, tokens: list[int], t_ns: int) -> RequestOutput:
        """Append a step's new tokens in order, checking stops after each: none past a stop is
        emitted. All but the last were computed this step (accepted drafts), so the computed
        count moves past them, and full blocks join the prefix cache before any finish."""
        emitted, text, reason = [], "", None
        for token in tokens:
            seq.token_ids.append(token)
            emitted.append(token)
            eos_ids = self.tokenizer.eos_token_ids
            reason = check_stop(token, seq.num_output_tokens, seq.params, eos_ids)
            hit_stop_string = False
            if reason != "stop":  # an EOS or stop token is not part of the text
                piece, hit_stop_string = seq.stop_matcher.push(seq.detokenizer.push(token))
                text += piece
            if hit_stop_string:
                reason = "stop"
            elif reason is not None:  # release the text held back for a possible stop string
                tail, hit_stop_string = seq.stop_matcher.push(seq.detokenizer.flush())
                text += tail if hit_stop_string else tail + seq.stop_matcher.flush()
            if reason is not None:
                break
        seq.num_computed_tokens += min(len(emitted), len(tokens) - 1)
        self.blocks.cache_full_blocks(
            seq.block_table, seq.token_ids, seq.num_computed_tokens, seq.prefix_ids
        )
        if reason is not None:
            seq.finish_reason = reason
            self.scheduler.finish(seq)
            del self._sequences[seq.request_id]
        return self._output(seq, tuple(emitted), text, t_ns)

    def _output(
        self, seq: Sequence, token_ids: tuple[int, ...], text: str, t_ns: int
    ) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=token_ids,
            new_text=text,
            t_ns=t_ns,
            finished=seq.finish_reason is not None,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            first_scheduled_ns=seq.first_scheduled_ns,
            num_proposed_tokens=seq.num_proposed_tokens,
            num_accepted_tokens=seq.num_accepted_tokens,
        )

    # -- convenience ----------------------------------------------------------------------

    def stream(self, prompt: str | Seq[int], params: SamplingParams) -> Iterator[RequestOutput]:
        """Run one request to completion alone, yielding its outputs as tokens arrive."""
        request_id = self.add_request(prompt, params)
        try:
            while True:
                for out in self.step():
                    if out.request_id == request_id:
                        yield out
                        if out.finished:
                            return
        finally:
            self.abort(request_id)

    def generate(
        self, prompts: Seq[str | Seq[int]], params: SamplingParams | Seq[SamplingParams]
    ) -> list[list[int]]:
        """Offline batch: run all prompts together; returns each one's generated token ids."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        while self.has_unfinished():
            for out in self.step():
                tokens[out.request_id] += out.new_token_ids
        return [tokens[i] for i in ids]

    def score(self, token_ids: Seq[int]) -> torch.Tensor:
        """Logits [T, V] (float32) of every position of token_ids, row i predicting token
        i + 1, from the engine's own forward pass through its paged cache (in prefill chunks
        of max_num_batched_tokens). Blocks are taken from the free ones and given back; call
        it between requests, from the thread that steps."""
        token_ids = list(token_ids)
        if not token_ids or len(token_ids) > self.model_config.max_position_embeddings:
            raise UserError(
                f"score: {len(token_ids)} tokens; give 1 to "
                f"{self.model_config.max_position_embeddings} (the model's context window)"
            )
        table: list[int] = []
        if not self.blocks.can_allocate(table, len(token_ids)):
            raise UserError(
                f"score: {len(token_ids)} tokens need "
                f"{blocks_for(len(token_ids), self.config.block_size)} KV blocks, "
                f"{self.blocks.num_free_blocks} are free; raise kv_cache_memory"
            )
        self.blocks.allocate(table, len(token_ids))
        try:
            return self.runner.score(token_ids, table, self.config.max_num_batched_tokens)
        finally:
            self.blocks.free(table)
