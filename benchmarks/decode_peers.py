"""Single-stream decode of smollm2-135m in one sitting: llmbench beside `transformers`,
CTranslate2 and llama.cpp, every engine on the same GGUF weights, same prompt, greedy, threads.

    python benchmarks/decode_peers.py --peers-python /work/peers/venv/bin/python
    python benchmarks/decode_peers.py --rows "llmbench b,llama.cpp F16" --tokens 16 --rounds 1

Rows: llmbench float32, bfloat16, int8 and int4 (weights quantised at load); `transformers.generate`
float32 and bfloat16 (the GGUF dequantised by transformers, in this process); CTranslate2 float32
and int8 (converted once from the GGUF through transformers); llama.cpp F32, F16 (the GGUF
dequantised by `benchmarks/gguf_dequantize.py`, cached) and Q4_1 (the GGUF itself). The peers
run in their own interpreter, `--peers-python` ($LLMBENCH_LLAMA_CPP_PYTHON by default;
DEVELOPERS.md says how to install them); without one only llmbench and transformers run.
`--rows` picks rows by name prefix ("llmbench", "llama.cpp F16", ...).

Every engine is loaded first (each peer in a process of its own, waiting for its turn), then the
read bandwidth is measured (`llmbench hardware`'s probes); then `--rounds` rounds each run every
row once, in turn: one generation of `--tokens` tokens from the same prompt ids, end-of-sequence
ignored, `--threads` threads. Round 0 is a warm-up. Rows interleaved this way see the same
neighbours on a shared machine. decode tok/s = (n − 1) / (t_last − t_first): the median over
rounds, with the range. GB/s: llmbench's from its step records and the cost model (the loaded
weights' real bytes, scales included, + K/V); another engine's = (its weights' bytes, each read
once a step, + the cost model's K/V bytes at its cache's precision) × tok/s. MBU = GB/s / the
read bandwidth. "x HF" = tok/s / `transformers` tok/s in the row's precision (float32, else
bfloat16). "agree" = leading greedy tokens equal to llmbench float32's (`transformers` and
CTranslate2 suppress end-of-sequence where the others decode past it: an EOS parts them). Each
peer says what its build uses of the CPU (`peer build:` llama.cpp's system info, CTranslate2's
version and compute types) above the table, and a line more where llama.cpp's build lacks an
instruction set it would use at its best on this CPU (`llama_cpp_build.py`); then the targets
the engine is held to. The load average before and after is printed: on this 2-core machine a
busy neighbour halves every number, so compare rows of one sitting only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

import gguf_dequantize
import llama_cpp_build
import peer_table
import torch
from peer_engines import Generation, LlmbenchRow, PeerRow, TransformersRow, ensure_ct2_model

from llmbench.engine import model_store
from llmbench.engine.config import ModelConfig
from llmbench.engine.weights import open_weights
from llmbench.kernels.cpu_info import this_cpu_flags

Row = LlmbenchRow | TransformersRow | PeerRow

MODEL = "smollm2-135m"
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
# Row → its precision (which `transformers` row it is divided by), in table order.
ROWS = {
    "llmbench float32": "float32",
    "llmbench bfloat16": "16-bit",
    "llmbench int8": "8-bit",
    "llmbench int4": "4-bit",
    "transformers float32": "float32",
    "transformers bfloat16": "16-bit",
    "CTranslate2 float32": "float32",
    "CTranslate2 int8": "8-bit",
    "llama.cpp F32": "float32",
    "llama.cpp F16": "16-bit",
    "llama.cpp Q4_1": "4-bit",
}
LLMBENCH = {  # row → (dtype, --quantize)
    "llmbench float32": ("float32", None),
    "llmbench bfloat16": ("bfloat16", None),
    "llmbench int8": ("bfloat16", "int8"),
    "llmbench int4": ("bfloat16", "int4"),
}
TRANSFORMERS = {"transformers float32": "float32", "transformers bfloat16": "bfloat16"}
CT2 = {"CTranslate2 float32": "float32", "CTranslate2 int8": "int8"}  # row → quantization
LLAMA_CPP = {"llama.cpp F32": "F32", "llama.cpp F16": "F16", "llama.cpp Q4_1": None}
CT2_KV_BYTES = 4  # CTranslate2 keeps K/V in float32 for float32 and int8 weights on a CPU
LLAMA_CPP_KV_BYTES = 2  # llama.cpp's default K/V cache type is F16


def select_rows(spec: str | None, has_peers: bool) -> list[str]:
    """Rows named by comma-separated prefixes (all when None), in table order; the peers' rows
    only with a peers interpreter (asked for without one: an error)."""
    is_peer = {name: name in CT2 or name in LLAMA_CPP for name in ROWS}
    if spec is None:
        return [name for name in ROWS if has_peers or not is_peer[name]]
    prefixes = [p.strip().lower() for p in spec.split(",") if p.strip()]
    for prefix in prefixes:
        if not any(name.lower().startswith(prefix) for name in ROWS):
            raise SystemExit(f"--rows: no row starts with {prefix!r}; rows: {', '.join(ROWS)}")
    chosen = [name for name in ROWS if any(name.lower().startswith(p) for p in prefixes)]
    if not has_peers and any(is_peer[name] for name in chosen):
        raise SystemExit(
            "--rows names CTranslate2 or llama.cpp rows: give --peers-python (an interpreter "
            "with llama-cpp-python and ctranslate2, see DEVELOPERS.md)"
        )
    return chosen


def check_peers_python(python: str) -> None:
    """One line and exit when `python` cannot import the peers."""
    try:
        done = subprocess.run(
            [python, "-c", "import llama_cpp, ctranslate2"], capture_output=True, text=True
        )
    except OSError as e:
        raise SystemExit(f"--peers-python {python}: cannot run it ({e.strerror})") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise SystemExit(f"--peers-python {python}: {last} (DEVELOPERS.md: installing the peers)")


def load_rows(names: list[str], args: argparse.Namespace, prompt_ids: list[int]) -> dict[str, Row]:
    """Every chosen engine, loaded (peers' files converted first where needed)."""
    gguf = model_store.pull(MODEL)
    cache = model_store.cache_dir() / "peers"
    job = {"tokens": args.tokens, "threads": args.threads, "prompt_ids": prompt_ids}
    rows: dict[str, Row] = {}
    for name in names:
        print(f"loading {name} ...", flush=True)
        if name in LLMBENCH:
            rows[name] = LlmbenchRow(*LLMBENCH[name], prompt_ids, args.tokens)
        elif name in TRANSFORMERS:
            rows[name] = TransformersRow(gguf, TRANSFORMERS[name], prompt_ids, args.tokens)
        elif name in CT2:
            folder = cache / f"{MODEL}-ct2-{CT2[name]}"
            ensure_ct2_model(args.peers_python, gguf, folder, CT2[name])
            ct2_job = {**job, "kind": "CTranslate2", "model": str(folder)}
            ct2_job["compute_type"] = CT2[name]
            weight_bytes = (folder / "model.bin").stat().st_size
            rows[name] = PeerRow(args.peers_python, ct2_job, weight_bytes, CT2_KV_BYTES)
        else:
            out_type = LLAMA_CPP[name]
            path = (
                gguf
                if out_type is None
                else gguf_dequantize.ensure_dequantized(gguf, out_type, cache)
            )
            weight_bytes = sum(t.num_bytes for t in open_weights(str(path)).tensor_infos())
            llama_job = {**job, "kind": "llama.cpp", "model": str(path)}
            rows[name] = PeerRow(args.peers_python, llama_job, weight_bytes, LLAMA_CPP_KV_BYTES)
    return rows


def interleaved_rounds(rows: dict[str, Row], rounds: int) -> dict[str, list[Generation]]:
    """`rounds` + 1 rounds, each row once per round in table order; round 0 (a warm-up) dropped."""
    generations: dict[str, list[Generation]] = {name: [] for name in rows}
    for round_number in range(rounds + 1):
        for name, row in rows.items():
            generation = row.decode()
            if round_number:
                generations[name].append(generation)
    return generations


def row_result(
    name: str, row: Row, done: list[Generation], config: ModelConfig, prompt_len: int, tokens: int
) -> peer_table.RowResult:
    """A row's rates and median bytes/s (llmbench's measured, the others' estimated); a peer's
    process is ended."""
    rates = tuple(g.tok_per_s for g in done)
    if isinstance(row, LlmbenchRow):
        bytes_per_s = statistics.median(g.bytes_per_s for g in done)
    else:
        per_token = peer_table.estimated_bytes_per_token(
            config, row.weight_bytes, row.kv_elem_bytes, prompt_len, tokens
        )
        bytes_per_s = per_token * statistics.median(rates)
    if isinstance(row, PeerRow):
        row.close()
    return peer_table.RowResult(name, ROWS[name], rates, bytes_per_s, done[-1].token_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="new tokens a generation")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (+1 warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default=None, help="comma-separated row name prefixes")
    parser.add_argument(
        "--peers-python",
        default=os.environ.get("LLMBENCH_LLAMA_CPP_PYTHON"),
        help="interpreter with llama-cpp-python and ctranslate2 (default: "
        "$LLMBENCH_LLAMA_CPP_PYTHON)",
    )
    parser.add_argument("--roof-budget-s", type=float, default=30.0, help="bandwidth probes")
    args = parser.parse_args()
    if args.tokens < 2 or args.rounds < 1:
        raise SystemExit("--tokens must be >= 2 and --rounds >= 1")
    names = select_rows(args.rows, bool(args.peers_python))
    if any(name in CT2 or name in LLAMA_CPP for name in names):
        check_peers_python(args.peers_python)
    torch.set_num_threads(args.threads)
    from llmbench.roofline import ceilings

    source = open_weights(MODEL)
    prompt_ids = source.tokenizer().encode_chat(PROMPT)
    load_before = os.getloadavg()[0]
    rows = load_rows(names, args, prompt_ids)
    roofs = ceilings.measure("cpu", budget_s=args.roof_budget_s, dtypes=())
    read = roofs["read_bytes_per_s"]
    started = time.perf_counter()
    generations = interleaved_rounds(rows, args.rounds)
    elapsed_s = time.perf_counter() - started
    results = [
        row_result(name, row, generations[name], source.config, len(prompt_ids), args.tokens)
        for name, row in rows.items()
    ]
    probe = roofs["probes"]["read"]
    print(
        f"\nread bandwidth {read / 1e9:.1f} GB/s (best of {probe['repeats']} read-only sums; "
        f"median {probe['median_per_s'] / 1e9:.1f}, spread {probe['spread']:.0%}); "
        f"{args.threads} threads, prompt {len(prompt_ids)} tokens, {args.tokens} new tokens "
        f"greedy, median of {args.rounds} interleaved rounds ({elapsed_s:.0f} s); load average"
        f" {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(
        "same weights everywhere: the Q4_1 GGUF (Q8_0 embeddings); llama.cpp F32 = its values "
        "dequantised, exactly what llmbench float32 runs; F16 = those rounded to float16 "
        "(llmbench bfloat16 rounds them to bfloat16)"
    )
    builds = {getattr(row, "build", None) for row in rows.values()} - {None}
    llama_cpp_builds = {row.build for name, row in rows.items() if name in LLAMA_CPP}
    for build in sorted(builds):
        print(f"peer build: {build}")
        if build in llama_cpp_builds:
            missing = llama_cpp_build.missing_from_build(build, this_cpu_flags())
            if missing:
                print(
                    f"peer build: llama.cpp is not at its best for this CPU: built without "
                    f"{', '.join(missing)}; `python benchmarks/llama_cpp_build.py` builds it so"
                )
    print("\n".join(peer_table.table_lines(results, read)))
    print("\ntargets, this sitting:")
    print("\n".join(peer_table.target_lines(results, read)))


if __name__ == "__main__":
    main()
