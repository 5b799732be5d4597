"""Tests for llmbench.engine.gguf_file: a tiny GGUF written here, and the real SmolLM2 file.

The tiny files are written the way llama.cpp's converter writes them (Q/K rows permuted for
Llama, dims innermost first, quantized blocks), from HF-order weights kept in the test; the
loader must give those weights back exactly, up to the storage type's own rounding
(`dequantize(quantize(x))`, which is row-local and so commutes with the row permutation).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from llmbench.engine.checkpoint import TensorInfo
from llmbench.engine.config import ModelConfig, RopeScaling
from llmbench.engine.gguf_file import GGUFSource
from llmbench.errors import UserError

T = gguf.GGMLQuantizationType

# Tiny model: 2 layers, hidden 64, 4 heads of 16 (2 KV heads), intermediate 256, vocab 300.
# (256, not smaller, so that down_proj rows hold one 256-value K-quant block.)
NUM_LAYERS, HIDDEN, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, INTER, VOCAB = 2, 64, 4, 2, 16, 256, 300

# GGUF tensor suffix -> (HF name suffix, [out, in] shape, storage type per layer 0 / layer 1).
# Every storage type appears; all inner dims are multiples of the 32-value quant block.
LAYER_TENSORS = {
    "attn_norm.weight": ("input_layernorm.weight", (HIDDEN,), (T.F32, T.F32)),
    "attn_q.weight": ("self_attn.q_proj.weight", (64, HIDDEN), (T.Q8_0, T.F32)),
    "attn_k.weight": ("self_attn.k_proj.weight", (32, HIDDEN), (T.Q4_0, T.F16)),
    "attn_v.weight": ("self_attn.v_proj.weight", (32, HIDDEN), (T.Q4_1, T.Q8_0)),
    "attn_output.weight": ("self_attn.o_proj.weight", (HIDDEN, 64), (T.F16, T.BF16)),
    "ffn_norm.weight": ("post_attention_layernorm.weight", (HIDDEN,), (T.F32, T.F32)),
    "ffn_gate.weight": ("mlp.gate_proj.weight", (INTER, HIDDEN), (T.Q4_1, T.Q4_0)),
    "ffn_up.weight": ("mlp.up_proj.weight", (INTER, HIDDEN), (T.Q8_0, T.Q4_1)),
    "ffn_down.weight": ("mlp.down_proj.weight", (HIDDEN, INTER), (T.F16, T.Q8_0)),
}
QWEN2_BIASES = {
    "attn_q.bias": ("self_attn.q_proj.bias", (64,)),
    "attn_k.bias": ("self_attn.k_proj.bias", (32,)),
    "attn_v.bias": ("self_attn.v_proj.bias", (32,)),
}
# Bytes per 32 values, from the block layouts: Q8_0 = f16 scale + 32 int8; Q4_0 = f16 scale +
# 16 bytes of nibbles; Q4_1 = f16 scale + f16 min + 16 bytes; F16/BF16 = 2 per value; F32 = 4.
BYTES_PER_32 = {T.Q8_0: 34, T.Q4_0: 18, T.Q4_1: 20, T.F16: 64, T.BF16: 64, T.F32: 128}
# Types the gguf package can dequantize but not quantize: written as random blocks.
NO_QUANTIZER = {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 297, 298, 299
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = (
    "the quick brown fox jumps over the lazy dog and then the dog sleeps while the fox runs "
    "over the hills to the other side of the river where the other foxes sleep"
)


# --- writing GGUF files the way llama.cpp does ---------------------------------------------


def llama_cpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py Q/K permutation (HF half-split -> interleaved pairs)."""
    return (
        w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def roundtrip(x: np.ndarray, qtype: T) -> np.ndarray:
    """What a tensor stored as `qtype` reads back as: the storage type's own rounding only."""
    return gguf.quants.dequantize(gguf.quants.quantize(x, qtype), qtype).reshape(x.shape)


def byte_symbols() -> list[str]:
    """GPT-2 byte-level BPE: the printable character standing for each byte 0..255."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    symbols, num_remapped = [], 0
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + num_remapped))
            num_remapped += 1
    return symbols


def train_merges(num_merges: int) -> list[tuple[str, str]]:
    """Greedy BPE on CORPUS (most frequent pair, ties by the pair's text): a valid merge list."""
    symbols = byte_symbols()
    words = [
        [symbols[b] for b in (word if i == 0 else " " + word).encode()]
        for i, word in enumerate(CORPUS.split(" "))
    ]
    merges = []
    for _ in range(num_merges):
        pairs = Counter(pair for word in words for pair in zip(word, word[1:], strict=False))
        (a, b), _ = max(pairs.items(), key=lambda item: (item[1], item[0]))
        merges.append((a, b))
        merged_words = []
        for word in words:
            out, j = [], 0
            while j < len(word):
                if j + 1 < len(word) and (word[j], word[j + 1]) == (a, b):
                    out.append(a + b)
                    j += 2
                else:
                    out.append(word[j])
                    j += 1
            merged_words.append(out)
        words = merged_words
    return merges


def add_tokenizer(writer: gguf.GGUFWriter) -> None:
    merges = train_merges(VOCAB - 256 - len(SPECIAL_TOKENS))
    tokens = byte_symbols() + [a + b for a, b in merges] + SPECIAL_TOKENS
    assert len(tokens) == VOCAB == len(set(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * 297 + [gguf.TokenType.CONTROL] * 3)
    writer.add_token_merges([f"{a} {b}" for a, b in merges])
    writer.add_bos_token_id(298)
    writer.add_eos_token_id(299)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_tiny_gguf(
    path: Path,
    *,
    arch: str = "llama",
    is_tied: bool = True,
    rope_freqs: np.ndarray | None = None,
    metadata: dict[str, float] | None = None,
    override_types: dict[str, T] | None = None,
) -> dict[str, np.ndarray]:
    """Write a tiny model; return the HF-named [out, in] weights the loader must give back."""
    rng = np.random.default_rng(0)
    override_types = override_types or {}
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name("tiny")
    writer.add_block_count(NUM_LAYERS)
    writer.add_context_length(2048)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(NUM_HEADS)
    writer.add_head_count_kv(NUM_KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    for key, value in (metadata or {}).items():
        writer.add_float32(key, value)
    add_tokenizer(writer)

    stored = [  # (GGUF name, HF name, [out, in] shape, storage type)
        ("token_embd.weight", "model.embed_tokens.weight", (VOCAB, HIDDEN), T.Q8_0),
        ("output_norm.weight", "model.norm.weight", (HIDDEN,), T.F32),
    ]
    if not is_tied:
        stored.append(("output.weight", "lm_head.weight", (VOCAB, HIDDEN), T.Q4_1))
    for n in range(NUM_LAYERS):
        for suffix, (hf_suffix, shape, types) in LAYER_TENSORS.items():
            stored.append((f"blk.{n}.{suffix}", f"model.layers.{n}.{hf_suffix}", shape, types[n]))
        if arch == "qwen2":
            for suffix, (hf_suffix, shape) in QWEN2_BIASES.items():
                stored.append((f"blk.{n}.{suffix}", f"model.layers.{n}.{hf_suffix}", shape, T.F32))

    expected = {}
    for gguf_name, hf_name, shape, qtype in stored:
        qtype = override_types.get(gguf_name, qtype)
        x = rng.standard_normal(shape).astype(np.float32)
        on_disk = x
        if arch == "llama" and ".attn_q." in gguf_name:
            on_disk = llama_cpp_permute(x, NUM_HEADS)
        elif arch == "llama" and ".attn_k." in gguf_name:
            on_disk = llama_cpp_permute(x, NUM_KV_HEADS)
        if qtype in NO_QUANTIZER:  # random blocks; gguf's dequantize is the reference
            assert on_disk is x, "random blocks for a permuted tensor are not supported here"
            block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
            # Bit 6 clear in every byte keeps each float16 scale's exponent below 31: finite.
            num_bytes = shape[1] // block_size * type_size
            data = rng.integers(0, 256, (shape[0], num_bytes), np.uint8) & 0xBF
            writer.add_tensor(gguf_name, data, raw_dtype=qtype)
            expected[hf_name] = gguf.quants.dequantize(data, qtype)
            continue
        data = gguf.quants.quantize(on_disk, qtype)
        writer.add_tensor(gguf_name, data, raw_dtype=None if qtype in (T.F32, T.F16) else qtype)
        expected[hf_name] = roundtrip(x, qtype)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def converter_rope_factors(factor: float, head_dim: int = HEAD_DIM) -> np.ndarray:
    """The rope_freqs tensor llama.cpp's converter writes for Llama-3.1 scaling (low 1, high 4,
    original context 8192), step by step as it computes it (float32 frequencies)."""
    base = 500000.0
    freqs = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < 8192 / 4:
            factors.append(1.0)
        elif wavelen > 8192 / 1:
            factors.append(factor)
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path / "tiny.gguf"
    return path, write_tiny_gguf(path)


# --- config, weights, infos ------------------------------------------------------------------


def test_config_from_metadata(tiny_gguf):
    path, _ = tiny_gguf
    source = GGUFSource(path)
    assert source.config == ModelConfig(
        vocab_size=300,  # no llama.vocab_size key: the token list's length
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=256,
        max_position_embeddings=2048,
        rope_theta=500000.0,
        rope_scaling=None,
        rms_norm_eps=1e-5,  # stored as float32 9.99999974e-06, read back as the intended 1e-5
        tie_word_embeddings=True,
        qkv_bias=False,
    )
    assert source.description == "GGUF tiny.gguf (tiny, Q8_0)"


@pytest.mark.parametrize("is_tied", [True, False])
def test_load_gives_back_hf_weights(tmp_path, is_tied):
    path = tmp_path / "tiny.gguf"
    expected = write_tiny_gguf(path, is_tied=is_tied)
    source = GGUFSource(path)
    assert source.config.tie_word_embeddings is is_tied
    weights = source.load(torch.float32, torch.device("cpu"))
    assert set(weights) == set(expected)
    assert ("lm_head.weight" in weights) is not is_tied
    for name, x in expected.items():
        assert weights[name].dtype == torch.float32
        # exact: F32 values as written, quantized ones as the storage type rounds them; Q/K
        # in HF row order although the file holds them permuted.
        assert torch.equal(weights[name], torch.from_numpy(x)), name
    # The permutation is not the identity, so the un-permute above is really tested.
    q = expected["model.layers.1.self_attn.q_proj.weight"]  # stored as F32
    assert not np.array_equal(llama_cpp_permute(q, NUM_HEADS), q)


def test_load_casts_to_dtype(tiny_gguf):
    path, expected = tiny_gguf
    weights = GGUFSource(path).load(torch.bfloat16, torch.device("cpu"))
    k = weights["model.layers.0.self_attn.k_proj.weight"]
    assert k.dtype == torch.bfloat16 and k.shape == (32, 64)
    expected_k = torch.from_numpy(expected["model.layers.0.self_attn.k_proj.weight"])
    assert torch.equal(k, expected_k.to(torch.bfloat16))


def test_qwen2_has_biases_and_no_permutation(tmp_path):
    path = tmp_path / "qwen.gguf"
    expected = write_tiny_gguf(path, arch="qwen2")
    source = GGUFSource(path)
    assert source.config.qkv_bias is True
    weights = source.load(torch.float32, torch.device("cpu"))
    assert set(weights) == set(expected)
    assert weights["model.layers.0.self_attn.k_proj.bias"].shape == (32,)
    for name, x in expected.items():
        assert torch.equal(weights[name], torch.from_numpy(x)), name


@pytest.mark.parametrize("qtype", [T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K])
def test_more_quant_types(tmp_path, qtype):
    path = tmp_path / "tiny.gguf"
    expected = write_tiny_gguf(path, override_types={"blk.0.ffn_down.weight": qtype})
    down = GGUFSource(path).load(torch.float32, torch.device("cpu"))[
        "model.layers.0.mlp.down_proj.weight"
    ]
    assert down.shape == (64, 256)
    assert torch.equal(down, torch.from_numpy(expected["model.layers.0.mlp.down_proj.weight"]))


def test_tensor_infos(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, is_tied=False)
    infos = {info.name: info for info in GGUFSource(path).tensor_infos()}
    assert len(infos) == 3 + 9 * NUM_LAYERS
    # Hand-computed: 300 x 64 Q8_0 = 600 blocks of 34 bytes.
    assert infos["token_embd.weight"] == TensorInfo("token_embd.weight", (300, 64), "Q8_0", 20400)
    assert infos["output.weight"] == TensorInfo("output.weight", (300, 64), "Q4_1", 12000)
    assert infos["output_norm.weight"] == TensorInfo("output_norm.weight", (64,), "F32", 256)
    assert infos["blk.0.attn_k.weight"] == TensorInfo("blk.0.attn_k.weight", (32, 64), "Q4_0", 1152)
    assert infos["blk.0.ffn_down.weight"] == TensorInfo(
        "blk.0.ffn_down.weight", (64, 256), "F16", 32768
    )
    assert infos["blk.1.attn_output.weight"].dtype == "BF16"
    for n in range(NUM_LAYERS):
        for suffix, (_, shape, types) in LAYER_TENSORS.items():
            info = infos[f"blk.{n}.{suffix}"]
            assert info.shape == shape
            assert info.dtype == types[n].name
            assert info.num_bytes == math.prod(shape) // 32 * BYTES_PER_32[types[n]]


def test_tokenizer_from_metadata(tiny_gguf):
    path, _ = tiny_gguf
    tokenizer = GGUFSource(path).tokenizer()
    # Ids 0-255 are the bytes, 256 + k the k-th merge: "the" = merge 1, "Ġfox" = merge 7.
    assert tokenizer.encode("the fox") == [257, 263]
    assert tokenizer.decode([257, 263]) == "the fox"
    assert tokenizer.encode("<|im_start|>") == [298]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_ids) == (298, (299,))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# --- Llama-3 RoPE scaling --------------------------------------------------------------------


def test_llama3_rope_scaling_from_rope_freqs(tmp_path):
    path = tmp_path / "llama3.gguf"
    factors = converter_rope_factors(8.0)
    # head_dim 16, theta 5e5: wavelengths 6.3, 32, 167, 861 keep their frequency (< 2048),
    # 4443 is blended, 22917 and up are slowed 8x (> 8192).
    assert factors[:4].tolist() == [1.0] * 4 and factors[5:].tolist() == [8.0] * 3
    assert 1.0 < factors[4] < 8.0
    expected = write_tiny_gguf(path, rope_freqs=factors)
    source = GGUFSource(path)
    assert source.config.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    weights = source.load(torch.float32, torch.device("cpu"))
    assert set(weights) == set(expected)  # rope_freqs is folded into the config, not a weight


def test_llama3_rope_factor_inferred_from_tensor(tmp_path):
    path = tmp_path / "llama32.gguf"
    write_tiny_gguf(path, rope_freqs=converter_rope_factors(32.0))  # Llama 3.2's factor
    assert GGUFSource(path).config.rope_scaling == RopeScaling(32.0, 1.0, 4.0, 8192)


def test_llama3_rope_metadata_must_match_tensor(tmp_path):
    path = tmp_path / "mismatch.gguf"
    write_tiny_gguf(
        path, rope_freqs=converter_rope_factors(8.0), metadata={"llama.rope.scaling.factor": 32.0}
    )
    with pytest.raises(UserError, match=r"mismatch\.gguf: the rope_freqs tensor does not match"):
        GGUFSource(path)


# --- bad input -------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "absent.gguf"
    with pytest.raises(UserError, match=f"{path}: no such file"):
        GGUFSource(path)


@pytest.mark.parametrize("keep_fraction", [0.5, 0.1, 0.001])
def test_truncated_file(tiny_gguf, keep_fraction):
    path, _ = tiny_gguf
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    with pytest.raises(UserError, match=f"{path}: .*truncated or corrupt"):
        GGUFSource(path)


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 not a gguf at all"])
def test_bad_magic(tmp_path, content):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(UserError, match=f"{path}: not a GGUF file"):
        GGUFSource(path)


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "gpt2.gguf"
    write_tiny_gguf(path, arch="gpt2")
    with pytest.raises(UserError, match=f"{path}: unsupported architecture 'gpt2'"):
        GGUFSource(path)


def test_unsupported_quant_type(tmp_path):
    path = tmp_path / "iq.gguf"
    write_tiny_gguf(path, override_types={"blk.1.ffn_up.weight": T.IQ4_NL})
    source = GGUFSource(path)  # the header is fine: infos work
    assert "IQ4_NL" in {info.dtype for info in source.tensor_infos()}
    with pytest.raises(UserError, match=f"{path}: tensor 'blk.1.ffn_up.weight' .* IQ4_NL"):
        source.load(torch.float32, torch.device("cpu"))


def test_unexpected_tensor(tmp_path):
    # A Llama-arch file with q/k/v biases (e.g. a Qwen2 mislabelled): refused, not half-loaded.
    path = tmp_path / "biased.gguf"
    write_tiny_gguf(path, arch="qwen2")
    data = path.read_bytes().replace(b"qwen2", b"llama")  # same length: offsets stay valid
    path.write_bytes(data)
    with pytest.raises(UserError, match=f"{path}: unexpected tensor 'blk.0.attn_q.bias'"):
        GGUFSource(path)


# --- the real model --------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_matches_transformers(smollm2_gguf_path: Path):
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    source = GGUFSource(smollm2_gguf_path)
    weights = source.load(torch.float32, torch.device("cpu"))
    load_s = time.perf_counter() - start
    assert load_s < 10, f"loading took {load_s:.1f} s"

    model = AutoModelForCausalLM.from_pretrained(
        smollm2_gguf_path.parent, gguf_file=smollm2_gguf_path.name, dtype=torch.float32
    )
    reference = model.state_dict()
    # SmolLM2 ties lm_head to the embedding: transformers lists it, the engine reuses the
    # embedding.
    assert set(weights) == set(reference) - {"lm_head.weight"}
    for name, tensor in weights.items():
        assert tensor.shape == reference[name].shape, name
        assert (tensor - reference[name]).abs().max().item() < 1e-6, name

    cfg, ref = source.config, model.config
    name = smollm2_gguf_path.name
    assert source.description == f"GGUF {name} (Smollm2 135M 8k Lc100K Mix1 Ep2, Q4_1)"
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers) == (
        ref.vocab_size,
        ref.hidden_size,
        ref.num_hidden_layers,
    )
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size) == (
        ref.num_attention_heads,
        ref.num_key_value_heads,
        ref.head_dim,
        ref.intermediate_size,
    )
    assert cfg.max_position_embeddings == ref.max_position_embeddings
    assert cfg.rope_theta == pytest.approx(ref.rope_parameters["rope_theta"])
    assert cfg.rms_norm_eps == pytest.approx(ref.rms_norm_eps, rel=1e-6)
    assert cfg.tie_word_embeddings is ref.tie_word_embeddings is True
    assert cfg.rope_scaling is None and cfg.qkv_bias is False
