"""The pure parts of benchmarks/serve/'s scripts (issue 31 item 5): row merging, ShareGPT sampling, configs."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "serve"))

from bench_common import fold_ids, merge_rows, sharegpt_pairs, table


def test_merge_rows_replaces_by_key_and_appends_the_rest(tmp_path):
    out = tmp_path / "r" / "rows.json"
    merge_rows(out, [{"workload": "a", "rate": 4, "mode": "server", "x": 1},
                     {"workload": "a", "rate": 16, "mode": "server", "x": 2}], ("workload", "rate", "mode"))
    rows = merge_rows(out, [{"workload": "a", "rate": 4, "mode": "server", "x": 3},
                            {"workload": "a", "rate": 4, "mode": "inproc", "x": 4}], ("workload", "rate", "mode"))
    assert [r["x"] for r in rows] == [3, 2, 4]  # replaced in place, new key appended
    assert json.loads(out.read_text()) == rows


class _Tok:
    """A whitespace tokenizer (one id per word) standing in for SmolLM2's."""

    def __call__(self, texts):
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=[[len(w) for w in t.split()] for t in texts])


def test_sharegpt_pairs_take_the_first_human_turn_and_vllms_filters(tmp_path):
    convs = [
        [("human", "a b c d e"), ("gpt", "1 2 3 4 5 6")],  # kept: 5 prompt, 6 output
        [("gpt", "hello there"), ("human", "w x y z"), ("gpt", "1 2 3 4")],  # kept: the first *human* turn
        [("human", "too short"), ("gpt", "1 2 3 4")],  # prompt < 4
        [("human", "a b c d"), ("gpt", "1 2 3")],  # output < 4
        [("human", " ".join(["w"] * 1025)), ("gpt", "1 2 3 4")],  # prompt > 1024
        [("human", " ".join(["w"] * 1000)), ("gpt", " ".join(["o"] * 1049))],  # prompt + output > 2048
        [("human", "only one turn")],
    ]
    path = tmp_path / "sg.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "conversations": [{"from": f, "value": v} for f, v in c]}) + "\n"
                            for i, c in enumerate(convs)))
    pairs = sharegpt_pairs(path, _Tok(), 10, seed=0)
    assert sorted((len(p), n) for p, n in pairs) == [(4, 4), (5, 6)]
    assert len(sharegpt_pairs(path, _Tok(), 1, seed=0)) == 1


def test_fold_ids_and_table():
    assert fold_ids([5, 7], 50) == [5, 7]
    folded = fold_ids([5, 49151], 1024)
    assert folded[0] == 5 and 100 <= folded[1] < 1024
    text = table([{"k": "x", "v": 1.5}, {"k": "yy", "v": None}], [("k", "kind", ""), ("v", "value", ".1f")])
    assert text.splitlines()[2].split() == ["x", "1.5"] and text.splitlines()[3].split() == ["yy", "-"]


def test_sharegpt_offline_configs():
    from sharegpt_offline import config_kwargs

    assert config_kwargs("default") == {}
    assert config_kwargs("kv_dtype=fp8_e4m3,max_num_seqs=1024") == {"kv_dtype": "fp8_e4m3", "max_num_seqs": 1024}
    assert config_kwargs("cascade=true,gpu_memory_utilization=0.8") == {"cascade": True, "gpu_memory_utilization": 0.8}
    with pytest.raises(SystemExit):
        config_kwargs("max_num_seqs")
