"""Decode CUDA graphs: bucket choice and padding on the CPU; graph == eager on a GPU when one is present."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from radixkv import LLM, SamplingParams
from radixkv.engine.cuda_graphs import _fill_table, _pow2_at_least, batch_buckets

from .tiny_models import tiny_config


def test_buckets_cover_every_batch_size_once() -> None:
    assert batch_buckets(1) == [1]
    assert batch_buckets(256)[:8] == [1, 2, 4, 8, 16, 24, 32, 40] and batch_buckets(256)[-1] == 256
    b = batch_buckets(100)
    assert b == sorted(set(b)) and b[-1] == 100 and all(x <= 100 for x in b)
    assert [_pow2_at_least(n) for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]


def test_padding_rows_and_columns_point_at_the_scratch_page() -> None:
    table = np.zeros((4, 5), dtype=np.int32)
    _fill_table(table, [[3, 4], [7]], scratch=9)  # columns past the longest row are never read
    assert table[:, :2].tolist() == [[3, 4], [7, 9], [9, 9], [9, 9]]


def test_cpu_and_enforce_eager_build_no_graphs() -> None:
    assert LLM(tiny_config("llama"), dtype="float32").runner.graphs is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (checked on the H200)")
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8_e4m3"])
def test_graph_replay_gives_the_eager_tokens(kv_dtype: str) -> None:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 160, (n,), generator=g).tolist() for n in (9, 40, 23)]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    outs = []
    for eager in (False, True):
        llm = LLM(tiny_config("llama"), dtype="bfloat16", kv_dtype=kv_dtype, device="cuda", num_pages=128,
                  enforce_eager=eager)
        outs.append([o.token_ids for o in llm.generate(prompts, params)])
        assert (llm.runner.graphs is None) == eager and (eager or llm.runner.graphs.replays > 0)
    assert outs[0] == outs[1]
