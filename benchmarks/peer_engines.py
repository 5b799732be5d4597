"""The engines of the peer table: each loaded once, then asked for one timed greedy generation.

Every engine gets the same prompt token ids (llmbench's chat template), decodes `tokens` new
tokens greedily past any end-of-sequence, and reports a `Generation`: decode tok/s =
(n − 1) / (t_last − t_first) from its own per-token timestamps, and the token ids (to check
that the engines agree). llmbench and `transformers` run in this process; llama.cpp and
CTranslate2 each in a process of its own started with the peers' interpreter, waiting on stdin
for its turn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.sampling import SamplingParams
from llmbench.harness.generate_stats import decode_bytes_per_s, decode_tok_per_s


@dataclass(frozen=True)
class Generation:
    """One timed generation. `bytes_per_s`: the engine's own achieved bandwidth (llmbench's,
    from its step records and the cost model); None: estimated from the row's weight bytes."""

    tok_per_s: float
    token_ids: tuple[int, ...]
    bytes_per_s: float | None = None


class LlmbenchRow:
    """llmbench's engine in `dtype`, weights quantised at load by `quantize` (None: as dtype)."""

    def __init__(self, dtype: str, quantize: str | None, prompt_ids: list[int], tokens: int):
        self.engine = LLMEngine(
            EngineConfig(dtype=dtype, device="cpu", max_num_seqs=1, quantize=quantize)
        )
        self.prompt_ids = prompt_ids
        self.params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    def decode(self) -> Generation:
        engine = self.engine
        engine.step_records.clear()
        token_ns, token_ids = [], []
        for out in engine.stream(self.prompt_ids, self.params):
            token_ns += [out.t_ns] * len(out.new_token_ids)
            token_ids += out.new_token_ids
        achieved = decode_bytes_per_s(
            engine.model_config,
            engine.step_records,
            engine.dtype.itemsize,
            engine.kv_cache.bytes_per_elem,
            weight_bytes=engine.model.weight_bytes,
        )
        return Generation(decode_tok_per_s(token_ns), tuple(token_ids), achieved)


class TransformersRow:
    """`transformers.generate` on the same GGUF (dequantised by transformers at load) in `dtype`,
    greedy, timed by a streamer; end-of-sequence is suppressed until `tokens` (`min_new_tokens`)."""

    def __init__(self, gguf: Path, dtype: str, prompt_ids: list[int], tokens: int):
        os.environ.setdefault("TQDM_DISABLE", "1")  # its GGUF loader's progress bar
        import transformers

        # Its load warns that GGUF weights stay packed unless asked for in float32; without the
        # `kernels` package they are dequantised to dense `dtype` weights (checked below).
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype)
        )
        kept = {p.dtype for p in self.model.parameters()} - {getattr(torch, dtype)}
        if kept:
            raise SystemExit(f"transformers {dtype}: weights loaded as {kept}, not dense {dtype}")
        self.ids = torch.tensor([prompt_ids])
        self.tokens = tokens
        # Every weight once (tied embeddings are one parameter): what a decode step reads.
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.kv_elem_bytes = self.model.dtype.itemsize

    def decode(self) -> Generation:
        stamps = _Stamps()
        self.model.generate(
            self.ids,
            attention_mask=torch.ones_like(self.ids),
            max_new_tokens=self.tokens,
            min_new_tokens=self.tokens,
            do_sample=False,
            streamer=stamps,
            pad_token_id=self.model.config.eos_token_id,
        )
        return Generation(decode_tok_per_s(stamps.token_ns), tuple(stamps.token_ids))


class _Stamps:
    """A `generate` streamer: the prompt arrives first, then each new token as a [1] tensor."""

    def __init__(self) -> None:
        self.token_ns: list[int] = []
        self.token_ids: list[int] = []
        self.seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if self.seen_prompt:
            self.token_ns.append(time.perf_counter_ns())
            self.token_ids += value.flatten().tolist()
        self.seen_prompt = True

    def end(self) -> None:
        pass


# Run by the peers' interpreter: argv[1] is a JSON job. It loads the model, prints "ready" and
# what its build uses of the CPU (llama.cpp's own system info: AVX512 = 1 | AMX_INT8 = 1 | ...;
# CTranslate2's version and compute types), then for every line on stdin decodes once and prints
# {"tok_per_s", "token_ids"} as one JSON line.
PEER_CODE = r"""
import json, sys, time
job = json.loads(sys.argv[1])
n = job["tokens"]
if job["kind"] == "llama.cpp":
    import llama_cpp
    from llama_cpp import Llama
    llm = Llama(model_path=job["model"], n_threads=job["threads"],
                n_threads_batch=job["threads"], n_ctx=2048, verbose=False)
    build = llama_cpp.llama_print_system_info().decode()

    def decode():
        stamps, ids = [], []
        for token in llm.generate(job["prompt_ids"], top_k=1, temp=0.0, reset=True):
            stamps.append(time.perf_counter_ns())
            ids.append(int(token))
            if len(ids) == n:
                return stamps, ids
else:
    import ctranslate2
    vocab = json.load(open(job["model"] + "/vocabulary.json"))
    tokens = [vocab[i] for i in job["prompt_ids"]]
    gen = ctranslate2.Generator(job["model"], device="cpu", compute_type=job["compute_type"],
                                intra_threads=job["threads"], inter_threads=1)
    types = ",".join(sorted(ctranslate2.get_supported_compute_types("cpu")))
    build = f"CTranslate2 {ctranslate2.__version__}: compute types {types}"

    def decode():
        stamps, ids = [], []
        for step in gen.generate_tokens(tokens, max_length=n, min_length=n, sampling_topk=1):
            stamps.append(time.perf_counter_ns())
            ids.append(step.token_id)
        return stamps, ids
print("ready " + " ".join(build.split()), flush=True)
for _line in sys.stdin:
    stamps, ids = decode()
    rate = (len(stamps) - 1) / ((stamps[-1] - stamps[0]) / 1e9)
    print(json.dumps({"tok_per_s": rate, "token_ids": ids}), flush=True)
"""


class PeerRow:
    """A peer engine in its own process (`job`: kind, model, tokens, threads, prompt_ids and,
    for CTranslate2, compute_type); `decode()` asks it for one generation."""

    def __init__(self, peers_python: str, job: dict, weight_bytes: int, kv_elem_bytes: float):
        self.weight_bytes = weight_bytes
        self.kv_elem_bytes = kv_elem_bytes
        self.proc = subprocess.Popen(
            [peers_python, "-c", PEER_CODE, json.dumps(job)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.what = f"{job['kind']} {job['model']}"
        ready, _, build = self.proc.stdout.readline().strip().partition(" ")
        if ready != "ready":
            raise SystemExit(f"{self.what}: the peer did not start (its error is above)")
        self.build = build  # what the peer's build uses of this CPU, in its own words

    def decode(self) -> Generation:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.what}: the peer stopped (its error is above)")
        reply = json.loads(line)
        return Generation(reply["tok_per_s"], tuple(reply["token_ids"]))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# Run by this interpreter with the peers' site-packages appended (CTranslate2's converter needs
# `transformers` and torch, which only this environment has): GGUF → HF folder → CTranslate2.
CONVERT_CODE = r"""
import sys, tempfile
sys.path.append(sys.argv[3])
import torch
from ctranslate2.converters import TransformersConverter
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
gguf, out, quantization = sys.argv[1], sys.argv[2], sys.argv[4]
folder, name = gguf.rsplit("/", 1)
loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
config = {k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
model = LlamaForCausalLM(LlamaConfig.from_dict(config))  # a GGUF-loaded model cannot be saved
model.load_state_dict(loaded.state_dict())
with tempfile.TemporaryDirectory() as hf:
    model.save_pretrained(hf)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(hf)
    TransformersConverter(hf).convert(out, quantization=quantization, force=True)
"""


def ensure_ct2_model(peers_python: str, gguf: Path, ct2_dir: Path, quantization: str) -> None:
    """Convert `gguf` for CTranslate2 into `ct2_dir` (float32 or int8 weights) unless done."""
    if (ct2_dir / "model.bin").is_file():
        return
    site = subprocess.run(
        [
            peers_python,
            "-c",
            "import ctranslate2, os; print(os.path.dirname(os.path.dirname(ctranslate2.__file__)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(f"converting {gguf.name} for CTranslate2 ({quantization}) into {ct2_dir} ...", flush=True)
    subprocess.run(
        [sys.executable, "-c", CONVERT_CODE, str(gguf), str(ct2_dir), site, quantization],
        check=True,
    )
