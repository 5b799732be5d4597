"""Variants of a run spec: the `variants:` list and `--vary` become checked specs before anything
runs, and every mistake is one line naming `variants[i].set.<key>` (or the `--vary` option)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmbench.errors import UserError
from llmbench.harness.spec_load import load_spec
from llmbench.harness.variants import (
    describe,
    folder_name,
    load_variants,
    split_values,
    vary_settings,
)

BASE = """name: t
model: synthetic:tiny
load: {kind: concurrency, concurrency: 2}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


def test_each_variant_is_the_spec_with_its_keys_set(tmp_path):
    path = write(
        tmp_path,
        BASE
        + """variants:
  - name: plain
  - name: int8
    set: {engine.quantize: int8}
  - name: kv-k8-v4
    set:
      engine.kv_cache_dtype: {k: int8, v: int4}
      engine.speculative.method: ngram
""",
    )
    base, variants = load_variants(path)
    assert [v.name for v in variants] == ["plain", "int8", "kv-k8-v4"]
    plain, int8, kv = (v.spec for v in variants)
    # A variant without `set` is the spec as written, and the spec as written ignores the list.
    assert plain == base
    assert load_spec(write(tmp_path, BASE)).hash() == base.hash()
    assert (plain.engine.quantize, int8.engine.quantize) == (None, "int8")
    assert int8.load == base.load and int8.model == "synthetic:tiny"
    assert (kv.engine.kv_cache_dtype.k, kv.engine.kv_cache_dtype.v) == ("int8", "int4")
    assert kv.engine.speculative.method == "ngram"
    assert dict(variants[2].settings) == {
        "engine.kv_cache_dtype": {"k": "int8", "v": "int4"},
        "engine.speculative.method": "ngram",
    }


def test_set_overrides_reach_every_variant_and_a_variant_key_wins(tmp_path):
    path = write(
        tmp_path,
        BASE + "variants:\n  - name: a\n  - name: b\n    set: {engine.quantize: int4:64}\n",
    )
    _, (a, b) = load_variants(path, ["seed=7", "engine.quantize=int8"])
    assert (a.spec.seed, b.spec.seed) == (7, 7)
    assert (a.spec.engine.quantize, b.spec.engine.quantize) == ("int8", "int4:64")


def test_a_spec_without_variants_is_a_plain_run(tmp_path):
    path = write(tmp_path, BASE)
    assert load_variants(path, ["seed=3"]) == (load_spec(path, ["seed=3"]), ())


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (
            "  - name: a\n    set: {engine.quantise: int8}\n",
            "x.yaml:6: variants[0].set.engine.quantise: unknown key; known keys here: block_size",
        ),
        (
            "  - name: a\n  - name: b\n    set:\n      engine.quantize: int9\n",
            "x.yaml:8: variants[1].set.engine.quantize: quantize 'int9': unknown scheme",
        ),
        (
            "  - name: a\n    set: {enigne.quantize: int8}\n",
            "variants[0].set.enigne.quantize: enigne: unknown key; known keys here: backend,",
        ),
        (
            "  - name: a\n    set: {engine.speculative: {method: guess}}\n",
            "variants[0].set.engine.speculative: engine.speculative.method: must be one of none, "
            "ngram, draft, got 'guess'",
        ),
        (
            "  - name: a\n    set: {model.size: 3}\n",
            "variants[0].set.model.size: 'model' is not a section",
        ),
        # A key the variant did not set, made impossible by one it did.
        (
            "  - name: a\n    set: {backend.kind: openai}\n",
            "x.yaml:5: variants[0]: backend.url: required for backend kind 'openai'",
        ),
        ("  - name: a\n  - name: a\n", "x.yaml:6: variants[1].name: 'a' names variants[0] already"),
        ("  - name: a/b\n", "variants[0].name: must be 1 to 64 letters, digits"),
        ("  - set: {seed: 1}\n", "variants[0].name: must be 1 to 64 letters, digits"),
        ("  - name: a\n    sets: {seed: 1}\n", "variants[0].sets: unknown key; known keys"),
        ("  - int8\n", "variants[0]: must be a mapping {name, set}, got str"),
        ("  - name: a\n    set: [seed]\n", "variants[0].set: must be a mapping of key.path"),
        (
            "  - name: a\n    set: {load.sweep: [1, 2]}\n",
            "variants[0].set.load.sweep: not with variants: each variant is one run",
        ),
    ],
)
def test_variant_mistakes_are_one_line_naming_the_key(tmp_path, items, message):
    path = write(tmp_path, BASE + "variants:\n" + items)
    with pytest.raises(UserError) as err:
        load_variants(path)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_list_and_sweep_mistakes(tmp_path):
    with pytest.raises(UserError, match="x.yaml:4: variants: must be a non-empty list"):
        load_variants(write(tmp_path, BASE + "variants: []\n"))
    swept = "name: t\nload: {kind: concurrency, sweep: [1, 2]}\nvariants:\n  - name: a\n"
    with pytest.raises(UserError, match="x.yaml:2: load.sweep: not with variants"):
        load_variants(write(tmp_path, swept))
    with pytest.raises(UserError, match="load.sweep: not with variants"):
        load_variants(write(tmp_path, BASE), ["load.sweep=[1, 2]"], ["seed=1,2"])
    with pytest.raises(UserError, match="--vary: .* lists variants already; use one or the other"):
        load_variants(write(tmp_path, BASE + "variants:\n  - name: a\n"), (), ["seed=1,2"])


def test_vary_makes_a_variant_per_value_named_by_it(tmp_path):
    base, variants = load_variants(write(tmp_path, BASE), (), ["engine.quantize=none,int8,int4:64"])
    assert [v.name for v in variants] == ["none", "int8", "int4-64"]
    assert [v.spec.engine.quantize for v in variants] == ["none", "int8", "int4:64"]
    assert [dict(v.settings) for v in variants] == [
        {"engine.quantize": "none"},
        {"engine.quantize": "int8"},
        {"engine.quantize": "int4:64"},
    ]
    assert variants[0].spec.seed == base.seed


def test_vary_twice_makes_every_combination(tmp_path):
    _, variants = load_variants(
        write(tmp_path, BASE),
        (),
        ["engine.quantize=none,int8", "engine.kv_cache_dtype={k: int8, v: int4},auto"],
    )
    assert [v.name for v in variants] == [
        "none_k-int8-v-int4",
        "none_auto",
        "int8_k-int8-v-int4",
        "int8_auto",
    ]
    assert variants[0].spec.engine.kv_cache_dtype.v == "int4"
    assert variants[3].spec.engine.kv_cache_dtype == "auto"


def test_vary_mistakes(tmp_path):
    path = write(tmp_path, BASE)
    cases = [
        (["engine.quantize=none,int9"], "--vary engine.quantize=int9: quantize 'int9': unknown"),
        (["engine.quantise=int8"], "--vary engine.quantise=int8: unknown key; known keys here"),
        (["engine.quantize"], "--vary engine.quantize: expected key.path=value,value,..."),
        (["seed=1,,2"], "--vary seed=1,,2: an empty value"),
        (["engine.quantize=int4:64,int4-64"], "two values make the same folder name"),
        (["seed=1,2", "seed=3"], "--vary seed=3: seed is varied twice"),
        (["seed={1"], "--vary seed={1: not a YAML value"),
        (["seed=1,:::"], "--vary seed=1,:::: value ':::' makes no folder name"),
    ]
    for vary, message in cases:
        with pytest.raises(UserError) as err:
            load_variants(path, (), vary)
        assert message in str(err.value), vary


def test_values_split_at_top_level_commas():
    assert split_values("none,int8, int4") == ["none", "int8", "int4"]
    assert split_values("{k: int8, v: int4},int8") == ["{k: int8, v: int4}", "int8"]
    assert split_values("[1, 2],3") == ["[1, 2]", "3"]
    assert split_values("'a,b',c") == ["'a,b'", "c"]
    assert split_values("x") == ["x"]


def test_folder_names_of_values():
    assert folder_name("int4:64") == "int4-64"
    assert folder_name("{k: int8, v: int4}") == "k-int8-v-int4"
    assert folder_name("0.5") == "0.5"
    assert folder_name("self:layers=8,quantize=int8") == "self-layers-8-quantize-int8"
    assert folder_name("x" * 80) == "x" * 64


def test_vary_settings_read_values_as_set_does():
    assert vary_settings(["seed=1,2"]) == [("1", {"seed": 1}), ("2", {"seed": 2})]
    assert vary_settings(["engine.quantize=null,int8"]) == [
        ("null", {"engine.quantize": None}),
        ("int8", {"engine.quantize": "int8"}),
    ]


def test_describe():
    assert describe({}) == "the spec as written"
    settings = {"engine.quantize": "int8", "engine.kv_cache_dtype": {"k": "int8", "v": "int4"}}
    assert describe(settings) == (
        'engine.quantize=int8, engine.kv_cache_dtype={"k": "int8", "v": "int4"}'
    )


def test_a_varied_kind_drops_the_old_kinds_keys_with_one_note(tmp_path):
    """`--vary load.kind=...` over a rate load: the concurrency variants drop the rate (before:
    `--vary variant concurrency_1: load.rate_per_s: not a field of concurrency loads`)."""
    path = write(tmp_path, "name: t\nload: {kind: poisson, rate_per_s: 2}\n")
    notes: list[str] = []
    _, variants = load_variants(
        path, (), ["load.kind=concurrency,poisson", "seed=1,2"], notes.append
    )
    assert [(v.name, v.spec.load.kind) for v in variants] == [
        ("concurrency_1", "concurrency"),
        ("concurrency_2", "concurrency"),
        ("poisson_1", "poisson"),
        ("poisson_2", "poisson"),
    ]
    assert variants[2].spec.load.rate_per_s == 2.0
    # Said once, though two variants switch.
    assert notes == [
        "note: --vary load.kind=concurrency drops load.rate_per_s (a field of poisson loads)"
    ]
    listed = write(
        tmp_path,
        "name: t\nload: {kind: poisson, rate_per_s: 2}\nvariants:\n  - name: closed\n"
        "    set: {load.kind: concurrency, load.concurrency: 2}\n",
    )
    notes.clear()
    _, (closed,) = load_variants(listed, (), (), notes.append)
    assert (closed.spec.load.kind, closed.spec.load.concurrency) == ("concurrency", 2)
    assert notes == [
        "note: variants[0] sets load.kind=concurrency: drops load.rate_per_s (a field of poisson "
        "loads)"
    ]


def test_a_set_mistake_with_variants_names_the_set(tmp_path):
    with pytest.raises(UserError) as err:
        load_variants(write(tmp_path, BASE), ["load.concurrency=0"], ["seed=1,2"])
    assert str(err.value) == "--set load.concurrency=0: load.concurrency: must be > 0, got 0"
