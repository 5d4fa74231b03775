"""The host KV tier's interfaces (issue 37) without a model: plan_host's sizing and refusals, `radixkv plan` with
both tiers, `radixkv serve --host-kv-cache-gb / --hicache-ratio` parsing, and the Prometheus series."""
from __future__ import annotations

import argparse
import json

import pytest

from radixkv.engine.core import EngineStats
from radixkv.plan_host import GIB, check_pinnable, host_pages, mem_available, parse_gb, parse_ratio, plan_host_tier

LLAMA3_8B = dict(architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                 torch_dtype="bfloat16")
PAGE_8B = 16 * 131072  # bytes of one bf16 page of 16 tokens: 32 layers x K,V x 8 heads x 128 x 2 bytes


def test_sizes_by_bytes_or_by_ratio():
    assert host_pages(1000, PAGE_8B, host_kv_cache_bytes=10 * PAGE_8B + 5) == 10
    assert host_pages(1000, PAGE_8B, hicache_ratio=2.5) == 2500
    assert host_pages(1000, PAGE_8B) == 0
    p = plan_host_tier(1000, 16, PAGE_8B, hicache_ratio=2.0)
    assert (p.host_pages, p.host_tokens, p.host_kv_bytes, p.total_tokens) == (2000, 32000, 2000 * PAGE_8B, 48000)
    with pytest.raises(ValueError, match="not both"):
        host_pages(1000, PAGE_8B, host_kv_cache_bytes=GIB, hicache_ratio=2.0)


def test_refusals_name_the_value():
    assert parse_gb("1.5") == GIB * 3 // 2 and parse_ratio("2") == 2.0
    for text, match in (("abc", "got 'abc'"), ("-2", "got '-2'"), ("nan", "got 'nan'")):
        with pytest.raises(ValueError, match=match):
            parse_gb(text)
    with pytest.raises(ValueError, match="--hicache-ratio must be a number > 0, got '0'"):
        parse_ratio("0")
    with pytest.raises(ValueError, match="host_kv_cache_bytes=99: .* 99 bytes .* 98 bytes"):
        check_pinnable(99, "host_kv_cache_bytes=99", available=98)
    check_pinnable(98, "host_kv_cache_bytes=98", available=98)
    avail = mem_available()
    assert avail is None or avail > 0


def test_plan_shows_both_tiers(tmp_path, capsys):
    from radixkv.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA3_8B))
    assert main(["plan", str(cfg), "--gpu-memory", "141GB", "--kv-dtype", "bf16", "--host-memory", "100GiB",
                 "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_page"] == PAGE_8B
    assert out["host_max_pages"] == 100 * GIB // PAGE_8B == out["host_tier"]["bf16"]["host_pages"]
    assert out["host_max_tokens"] == 16 * out["host_max_pages"]
    assert out["total_max_tokens"] == out["max_tokens"] + out["host_max_tokens"]
    assert main(["plan", str(cfg), "--gpu-memory", "141GB", "--hicache-ratio", "3"]) == 0
    table = capsys.readouterr().out
    assert "host tokens" in table and "both tiers" in table
    assert main(["plan", str(cfg), "--gpu-memory", "141GB", "--hicache-ratio", "-3"]) != 0
    assert "hicache_ratio must be a finite number > 0, got -3.0" in capsys.readouterr().err


def _serve_parser() -> argparse.ArgumentParser:
    from radixkv.serve.cli_serve import add_serve_parser

    p = argparse.ArgumentParser()
    add_serve_parser(p.add_subparsers())
    return p


def test_serve_flags(tmp_path, capsys):
    from radixkv.serve.cli_serve import llm_kwargs, resolve_options

    p = _serve_parser()
    kw = llm_kwargs(resolve_options(p.parse_args(["serve", "m", "--host-kv-cache-gb", "2"])))
    assert kw["host_kv_cache_bytes"] == 2 * GIB and "hicache_ratio" not in kw
    kw = llm_kwargs(resolve_options(p.parse_args(["serve", "m", "--hicache-ratio", "1.5"])))
    assert kw["hicache_ratio"] == 1.5 and "host_kv_cache_bytes" not in kw
    assert "host_kv_cache_bytes" not in llm_kwargs(resolve_options(p.parse_args(["serve", "m"])))
    for bad, needle in ((["--host-kv-cache-gb", "lots"], "got 'lots'"), (["--host-kv-cache-gb", "-1"], "got '-1'"),
                        (["--hicache-ratio", "x"], "got 'x'")):
        with pytest.raises(SystemExit):
            p.parse_args(["serve", "m", *bad])
        assert needle in capsys.readouterr().err
    with pytest.raises(ValueError, match="not both"):
        resolve_options(p.parse_args(["serve", "m", "--host-kv-cache-gb", "1", "--hicache-ratio", "2"]))
    with pytest.raises(ValueError, match=r"--host-kv-cache-gb 1e\+06: .* more than this machine can pin"):
        resolve_options(p.parse_args(["serve", "m", "--host-kv-cache-gb", "1000000"]))
    conf = tmp_path / "c.yaml"
    conf.write_text("host-kv-cache-gb: -4\n")
    with pytest.raises(ValueError, match="--host-kv-cache-gb must be a number of GiB >= 0, got '-4"):
        resolve_options(p.parse_args(["serve", "m", "--config", str(conf)]))


def test_prometheus_series_by_tier_and_direction():
    from radixkv.serve.metrics import ServeMetrics

    m = ServeMetrics("tiny")
    m.on_step(EngineStats(0, 0, 10, 0, 100, 60, 0, 1, 1, host_hit_tokens=40, host_pages=20, host_pages_used=5,
                          bytes_d2h=4096, bytes_h2d=2048, failed_copies=1), 0)
    text = m.render().decode()
    assert 'radixkv:prefix_cache_hits_by_tier_total{model_name="tiny",tier="gpu"} 20.0' in text
    assert 'radixkv:prefix_cache_hits_by_tier_total{model_name="tiny",tier="host"} 40.0' in text
    assert 'radixkv:kv_transfer_bytes_total{direction="d2h",model_name="tiny"} 4096.0' in text
    assert 'radixkv:kv_transfer_bytes_total{direction="h2d",model_name="tiny"} 2048.0' in text
    assert 'radixkv:host_kv_cache_usage_perc{model_name="tiny"} 0.25' in text
    assert 'radixkv:kv_transfer_failures_total{model_name="tiny"} 1.0' in text
