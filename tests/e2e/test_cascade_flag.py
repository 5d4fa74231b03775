"""cascade=True is refused by LLM until the engine runs cascade decode (the scheduler builds the groups)."""
from __future__ import annotations

import pytest

from radixkv.engine.llm import LLM

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100}


def test_cascade_is_refused_by_name():
    with pytest.raises(ValueError, match="cascade"):
        LLM(TINY, cascade=True)
