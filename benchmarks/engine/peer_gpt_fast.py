"""gpt-fast's decode step on the decode sweep's shape: the peer for bench_e2e_gpu.py's Part A (issue 35).

    python benchmarks/engine/peer_gpt_fast.py --gpt-fast benchmarks/cache/peers/gpt-fast --json OUT.json
    python benchmarks/engine/peer_gpt_fast.py --gpt-fast DIR --smoke          # CPU, tiny model, eager

DIR holds gpt-fast's model.py (github.com/pytorch-labs/gpt-fast; benchmarks/cache/peers/ is git-ignored, the
file is not part of radixkv; rows keep the file's sha1). The model is gpt-fast's `Transformer` with the "llama-3-8b" config and random
bf16 weights; its decode step is what gpt-fast's generate.py runs: one token a row through the model with
the static KV cache, `torch.compile(mode="reduce-overhead", fullgraph=True)` (CUDA graphs), inductor's
coordinate-descent tuning on and the math SDPA kernel for inductor to generate, as generate.py sets them.
Greedy (argmax of the last logits) to match the sweep's GREEDY rows. Each batch: rows at context `--prompt`
(cache filled with random values), `--new` steps timed back to back after the compile (one synchronise at
the end: no per-step host wait, the peer's best case), reported as ms a step. Batches run in the order given;
each compiles anew (torch._dynamo.reset), so put the ones that matter first.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch


def load_gpt_fast(folder: Path):
    """gpt-fast's model module, imported from folder/model.py."""
    path = folder / "model.py"
    if not path.is_file():
        raise SystemExit(f"no gpt-fast model.py in {folder} (clone github.com/pytorch-labs/gpt-fast there)")
    spec = importlib.util.spec_from_file_location("gpt_fast_model", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dynamo re-imports the model's module by name while tracing
    spec.loader.exec_module(mod)
    return mod


def greedy_step(model, x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
    """x: [B, 1] token ids, input_pos: [1] -> the next tokens [B, 1] (gpt-fast's decode_one_token, greedy)."""
    logits = model(x, input_pos)  # [B, 1, V]
    return logits[:, -1].argmax(-1, keepdim=True).to(x.dtype)


def time_batch(model, batch: int, prompt: int, new: int, device: torch.device, compiled: bool) -> dict:
    """Set up the caches for `batch` rows of prompt + new tokens, compile, time `new` steps."""
    model.max_batch_size = model.max_seq_length = -1  # setup_caches returns early when the old ones are big enough
    for layer in model.layers:
        layer.attention.kv_cache = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    with torch.device(device):
        model.setup_caches(max_batch_size=batch, max_seq_length=prompt + new)
    for layer in model.layers:  # the prompt's K/V: random values, as a prefill would leave
        for cache in (layer.attention.kv_cache.k_cache, layer.attention.kv_cache.v_cache):
            cache[:, :, :prompt].normal_()
    torch._dynamo.reset()
    step = torch.compile(greedy_step, mode="reduce-overhead", fullgraph=True) if compiled else greedy_step
    sdpa = (torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH) if device.type == "cuda"
            else contextlib.nullcontext())
    x = torch.zeros(batch, 1, dtype=torch.int, device=device)
    pos = torch.tensor([prompt], dtype=torch.int64, device=device)
    t0 = time.perf_counter()
    with torch.inference_mode(), sdpa:
        for _ in range(3):  # compile and capture (reduce-overhead records a graph from the second call)
            x = step(model, x, pos).clone()
        if device.type == "cuda":
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        pos.fill_(prompt)
        t = time.perf_counter()
        for _ in range(new):
            x = step(model, x, pos).clone()
            pos += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1e3 / new
    return {"engine": "gpt-fast", "batch": batch, "prompt": prompt, "new_tokens": new,
            "step_ms": round(ms, 3), "compile_s": round(compile_s, 1), "compiled": compiled}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpt-fast", default="benchmarks/cache/peers/gpt-fast", help="folder with gpt-fast's model.py")
    ap.add_argument("--batches", default="1,64,16,256")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--json", default=None, help="rows appended here (a JSON list)")
    ap.add_argument("--smoke", action="store_true", help="CPU, gpt-fast's stories15M config, eager")
    a = ap.parse_args()
    mod = load_gpt_fast(Path(a.gpt_fast))
    source = hashlib.sha1((Path(a.gpt_fast) / "model.py").read_bytes()).hexdigest()[:12]  # which gpt-fast ran
    cuda = torch.cuda.is_available() and not a.smoke
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:  # generate.py's inductor settings
        import torch._inductor.config as inductor

        inductor.coordinate_descent_tuning = True
        inductor.triton.unique_kernel_names = True
        inductor.fx_graph_cache = True
    name = "stories15M" if a.smoke else "llama-3-8b"
    with torch.device(device):
        model = mod.Transformer.from_name(name)
    model = model.to(dtype=torch.bfloat16 if cuda else torch.float32).eval()
    rows = []
    for batch in (int(b) for b in a.batches.split(",")):
        row = time_batch(model, batch, a.prompt if not a.smoke else 16, a.new if not a.smoke else 4,
                         device, compiled=cuda)
        row.update(model=name, model_py_sha1=source)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.json:  # after every batch: a timeout later keeps what was measured
            path = Path(a.json)
            old = json.loads(path.read_text()) if path.exists() else []
            path.write_text(json.dumps(old + [row], indent=1) + "\n")
    print(f"\n{'batch':>6} {'gpt-fast ms/step':>17} {'compile s':>10}")
    for r in rows:
        print(f"{r['batch']:>6} {r['step_ms']:>17.3f} {r['compile_s']:>10.1f}")


if __name__ == "__main__":
    sys.exit(main())
