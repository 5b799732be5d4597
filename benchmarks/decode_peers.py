"""Single-stream decode of smollm2-135m in one sitting: llmbench in bfloat16, int8 and int4 beside
CTranslate2 int8 and llama.cpp Q4_1 (the GGUF itself), same prompt, tokens and threads.

    python benchmarks/decode_peers.py --peers-python /work/peers/venv/bin/python

The peers run in their own interpreter (DEVELOPERS.md says how to install them); without
`--peers-python` only the llmbench rows run. CTranslate2 needs the model converted once: the
script does it into `--ct2-dir` (from the GGUF through `transformers`, then CTranslate2's own
converter, quantization int8).

Every engine is loaded first (each peer in a process of its own, waiting for its turn); then
`--rounds` rounds each run every row once, in turn: one generation of `--tokens` tokens from the
same chat prompt, end-of-sequence ignored, `--threads` threads. Round 0 is a warm-up. Rows
interleaved this way see the same neighbours on a shared machine. decode tok/s =
(n − 1) / (t_last − t_first): the median over rounds, with the range. GB/s: llmbench's from its
step records and the cost model (the loaded weights' real bytes, scales included, + K/V); a
peer's ≈ its weight file's bytes (every weight read once a step) × tok/s. MBU = GB/s / the read
bandwidth measured at the start. The load average before and after is printed: on this 2-core
machine a busy neighbour halves every number, so compare rows of one sitting only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from llmbench.engine import model_store
from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.sampling import SamplingParams
from llmbench.engine.weights import open_weights
from llmbench.harness.generate_stats import decode_bytes_per_s, decode_tok_per_s

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
LLMBENCH_ROWS = {"bfloat16": None, "int8": "int8", "int4": "int4"}  # row → --quantize

# Run by the peers' interpreter: argv[1] is a JSON job. It loads the model, prints "ready", then
# for every line on stdin decodes once and prints that generation's tok/s.
PEER_CODE = r"""
import json, sys, time
job = json.loads(sys.argv[1])
n = job["tokens"]
if job["kind"] == "llama.cpp":
    from llama_cpp import Llama
    llm = Llama(model_path=job["model"], n_threads=job["threads"],
                n_threads_batch=job["threads"], n_ctx=2048, verbose=False)

    def decode():
        stamps = []
        for _token in llm.generate(job["prompt_ids"], top_k=1, temp=0.0, reset=True):
            stamps.append(time.perf_counter_ns())
            if len(stamps) == n:
                return stamps
else:
    import ctranslate2
    vocab = json.load(open(job["model"] + "/vocabulary.json"))
    tokens = [vocab[i] for i in job["prompt_ids"]]
    gen = ctranslate2.Generator(job["model"], device="cpu", compute_type="int8",
                                intra_threads=job["threads"], inter_threads=1)

    def decode():
        steps = gen.generate_tokens(tokens, max_length=n, min_length=n, sampling_topk=1)
        return [time.perf_counter_ns() for _step in steps]
print("ready", flush=True)
for _line in sys.stdin:
    stamps = decode()
    print((len(stamps) - 1) / ((stamps[-1] - stamps[0]) / 1e9), flush=True)
"""

# Run by this interpreter with the peers' site-packages appended (CTranslate2's converter needs
# `transformers` and torch, which only this environment has): GGUF → HF folder → CTranslate2.
CONVERT_CODE = r"""
import sys, tempfile
sys.path.append(sys.argv[3])
import torch
from ctranslate2.converters import TransformersConverter
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
gguf, out = sys.argv[1], sys.argv[2]
folder, name = gguf.rsplit("/", 1)
loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
config = {k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
model = LlamaForCausalLM(LlamaConfig.from_dict(config))  # a GGUF-loaded model cannot be saved
model.load_state_dict(loaded.state_dict())
with tempfile.TemporaryDirectory() as hf:
    model.save_pretrained(hf)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(hf)
    TransformersConverter(hf).convert(out, quantization="int8", force=True)
"""


class LlmbenchRow:
    """An engine of one configuration; `decode()` runs one generation."""

    def __init__(self, quantize: str | None, tokens: int):
        self.engine = LLMEngine(
            EngineConfig(dtype="bfloat16", device="cpu", max_num_seqs=1, quantize=quantize)
        )
        self.prompt = self.engine.tokenizer.encode_chat(PROMPT)
        self.params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        self.gb_per_s: list[float] = []

    def decode(self) -> float:
        engine = self.engine
        engine.step_records.clear()
        token_ns = [out.t_ns for out in engine.stream(self.prompt, self.params)]
        achieved = decode_bytes_per_s(
            engine.model_config,
            engine.step_records,
            engine.dtype.itemsize,
            engine.kv_cache.bytes_per_elem,
            weight_bytes=engine.model.weight_bytes,
        )
        self.gb_per_s.append(achieved / 1e9)
        return decode_tok_per_s(token_ns)


class PeerRow:
    """A peer engine loaded in its own process; `decode()` asks it for one generation."""

    def __init__(self, peers_python: str, job: dict, weight_bytes: int):
        self.weight_bytes = weight_bytes
        self.proc = subprocess.Popen(
            [peers_python, "-c", PEER_CODE, json.dumps(job)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"{job['kind']}: the peer did not start")

    def decode(self) -> float:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def ensure_ct2_model(peers_python: str, gguf: Path, ct2_dir: Path) -> None:
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
    print(f"converting {gguf.name} for CTranslate2 (int8) into {ct2_dir} ...", file=sys.stderr)
    subprocess.run([sys.executable, "-c", CONVERT_CODE, str(gguf), str(ct2_dir), site], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=6, help="measured rounds (+1 warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peers-python", default=None)
    parser.add_argument(
        "--ct2-dir",
        type=Path,
        default=Path.home() / ".cache/llmbench/peers/smollm2-135m-ct2-int8",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from llmbench.harness import hardware

    gguf = model_store.pull("smollm2-135m")
    rows: dict[str, LlmbenchRow | PeerRow] = {
        f"llmbench {name}": LlmbenchRow(quantize, args.tokens)
        for name, quantize in LLMBENCH_ROWS.items()
    }
    if args.peers_python:
        ensure_ct2_model(args.peers_python, gguf, args.ct2_dir)
        source = open_weights("smollm2-135m")
        job = {
            "tokens": args.tokens,
            "threads": args.threads,
            "prompt_ids": source.tokenizer().encode_chat(PROMPT),
        }
        ct2_bytes = (args.ct2_dir / "model.bin").stat().st_size
        gguf_bytes = sum(t.num_bytes for t in source.tensor_infos())
        ct2_job = {**job, "kind": "CTranslate2", "model": str(args.ct2_dir)}
        rows["CTranslate2 int8"] = PeerRow(args.peers_python, ct2_job, ct2_bytes)
        gguf_job = {**job, "kind": "llama.cpp", "model": str(gguf)}
        rows["llama.cpp Q4_1"] = PeerRow(args.peers_python, gguf_job, gguf_bytes)
    load_before = os.getloadavg()[0]
    read = hardware.measure("cpu", budget_s=30, dtypes=())["read_bytes_per_s"] / 1e9
    rates: dict[str, list[float]] = {name: [] for name in rows}
    for round_number in range(args.rounds + 1):
        for name, row in rows.items():
            rate = row.decode()
            if round_number:  # round 0 warms every engine up
                rates[name].append(rate)
    print(
        f"read bandwidth {read:.1f} GB/s; {args.threads} threads, {args.tokens} tokens, median "
        f"of {args.rounds} interleaved rounds; load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    print(f"{'engine':<20}{'tok/s':>8}{'(min-max)':>14}{'GB/s':>8}{'MBU':>7}")
    for name, row in rows.items():
        rate = statistics.median(rates[name])
        if isinstance(row, LlmbenchRow):
            gb_per_s = statistics.median(row.gb_per_s[1:])
        else:
            gb_per_s = row.weight_bytes * rate / 1e9
            row.close()
        spread = f"({min(rates[name]):.1f}-{max(rates[name]):.1f})"
        print(f"{name:<20}{rate:8.1f}{spread:>14}{gb_per_s:8.2f}{gb_per_s / read:7.2f}")


if __name__ == "__main__":
    main()
