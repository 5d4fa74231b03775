"""`radixkv plan` refuses configs no model can have, and inputs that once ended in a traceback (issue 33
item 11): one line naming the file and field, exit 2."""
from __future__ import annotations

import json

import pytest

from radixkv.cli import main
from radixkv.model_shape import ModelShape

OK = dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
          intermediate_size=1024, vocab_size=1000, torch_dtype="bfloat16")


@pytest.mark.parametrize("change, needle", [
    (dict(num_key_value_heads=0), "'num_key_value_heads' must be a positive integer, got 0"),
    (dict(num_key_value_heads=16), "num_key_value_heads 16 must divide num_attention_heads 8"),
    (dict(num_key_value_heads=3), "num_key_value_heads 3 must divide num_attention_heads 8"),
    (dict(hidden_size=500), "hidden_size 500 is not a multiple of num_attention_heads 8"),
    (dict(num_hidden_layers=10**30), "'num_hidden_layers' is a 31-digit integer, more than any model has"),
    (dict(num_hidden_layers=1e30), "'num_hidden_layers' must be a positive integer"),
    (dict(vocab_size=2**40), "'vocab_size' is a 13-digit integer"),
    (dict(torch_dtype="int3"), "'torch_dtype' 'int3' is not a weight dtype"),
    (dict(head_dim=0), "'head_dim' must be a positive integer, got 0"),
])
def test_impossible_configs_are_one_line(tmp_path, capsys, change, needle) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(OK, **change)))
    assert main(["plan", str(path), "--gpu-memory", "80GiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and needle in err, err


def test_a_deeply_nested_config_is_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "config.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    assert main(["plan", str(path), "--gpu-memory", "80GiB"]) == 2
    assert "nested too deeply" in capsys.readouterr().err


def test_json_to_a_full_device_is_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(OK))
    assert main(["plan", str(path), "--gpu-memory", "80GiB", "--json", "/dev/full"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "radixkv: error: --json /dev/full: cannot write: No space left on device"


def test_sound_configs_still_plan(tmp_path, capsys) -> None:
    for cfg in (OK, dict(OK, num_key_value_heads=None), dict(OK, torch_dtype="bf16"), dict(OK, head_dim=80),
                dict(OK, torch_dtype=None, dtype="float16")):
        shape = ModelShape.from_config(cfg, "m")
        assert shape.num_kv_heads in (2, 8) and shape.dtype in ("bfloat16", "float16")
    assert ModelShape.from_config(dict(OK, head_dim=80), "m").head_dim == 80
