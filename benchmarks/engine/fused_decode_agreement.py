"""Teacher-forced agreement with transformers through decode steps, the fused decode kernels on and off
(issue 35's accuracy target), small random models in bf16 on the GPU:

    python benchmarks/engine/fused_decode_agreement.py [--rows 8] --json OUT.json

transformers (its own attention, bf16) continues `--rows` prompts of 64 tokens greedily for 128 tokens; our
engine then reads prompt + continuation with every continuation position computed as a decode step of
all rows (radixkv.engine.teacher.teacher_forced, decode_from = 64), and the row is the share of
positions whose argmax is transformers' next token. The same LLM runs it with the fused decode path
(model.fused_decode_rows = 64: decode_rows_fused up to 16 rows, decode_rows_tall from 33) and without (0).
gpu_engine_check.py's parity models (initializer_range 0.1: peaked next-token distributions); Qwen2 (q/k/v
biases) and Qwen3 (q/k norms) do not take the fused path and are left out.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_engine_check import hf_greedy, small_config  # noqa: E402

from radixkv import LLM  # noqa: E402
from radixkv.engine.teacher import teacher_forced  # noqa: E402

PROMPT, NEW = 64, 128


def agreement(llm: LLM, rows: list[list[int]]) -> float:
    forced = teacher_forced(llm, rows, decode_from=PROMPT)
    hits = [(f.argmax[PROMPT - 1:-1] == torch.tensor(r[PROMPT:])).float().mean().item() for f, r in zip(forced, rows)]
    return sum(hits) / len(hits)


def main() -> int:
    from transformers import AutoModelForCausalLM

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny models (CPU when no GPU)")
    ap.add_argument("--rows", type=int, default=8, help="prompts, each step's decode rows (33-64: the tall path)")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = []
    for arch in ("llama", "mistral"):
        cfg = small_config(arch, a.smoke)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, cfg.vocab_size, (PROMPT,), generator=g).tolist() for _ in range(a.rows)]
        with tempfile.TemporaryDirectory() as folder:
            torch.manual_seed(0)
            AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(folder)
            ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(device).eval()
            rows = [p + hf_greedy(ref, p, NEW) for p in prompts]
            del ref
            llm = LLM(folder, dtype="bfloat16", device=device, enforce_eager=True)
            model = llm.runner.model
            fused_rows = model.fused_decode_rows
            row = dict(arch=arch, rows=a.rows, head_dim=model.spec.head_dim, fused_available=fused_rows > 0)
            for name, n in (("fused", 64), ("unfused", 0)):
                if name == "fused" and not fused_rows:
                    continue
                model.fused_decode_rows = n
                row[f"forced_agreement_{name}"] = round(agreement(llm, rows), 4)
            out.append(row)
            print(json.dumps(row), flush=True)
            del llm
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
