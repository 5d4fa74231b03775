"""INT KV quantisation options on SmolLM2-135M-Instruct, simulated: which format to build before building it.

    python benchmarks/engine/kv_quant_options.py                      # every option below, ~20-60 s each
    python benchmarks/engine/kv_quant_options.py "kgs=16;vgs=16" "rot=True;kgs=32" --windows 4

transformers' own forward pass of the model (fp32, CPU, one thread) with an attention that rounds K and V
to bf16 (the reference, as bf16 KV) and then, per option, quantises them as radixkv's INT format does
(kernels/intq.py: per-token groups along head_dim, asymmetric float16 (scale, zero), round to nearest) and
attends over the dequantised values. Post-RoPE K, as the engine stores it. Only attention's inputs change,
so the figures say what a KV format costs, not what a kernel does (benchmarks/engine/kv_accuracy.py
measures the engine itself). Text: kv_accuracy.py's perplexity windows (GSM8K answers, ShareGPT assistant
turns), `--windows` windows of 256 tokens a source.

An option is `key=value` pairs joined by `;`, over the default int4 K and V in groups of 64 values:
- kbits / vbits (4, 2; 0 = keep bf16), kgs / vgs: values a group holds (option a: finer groups);
- sm=True: K divided by a static per-(layer, head, channel) scale and q multiplied by it (option b:
  SmoothQuant-like; the scale is amax^alpha of K over the same text, `alpha`, default 0.5: calibrated
  on the evaluation text, so optimistic); sm='w': the scale from the weights only (the norm of each
  k_proj row times the input norm's weight, tied across RoPE pairs so that it commutes with RoPE and
  could fold into q_proj / k_proj);
- rot=True: K and q rotated by a 64 x 64 Hadamard matrix before K is quantised (option c: q . k is
  invariant); vrot=True: V rotated and the output rotated back;
- window=R: the R most recent tokens of every query read as bf16 (option d: KIVI's full-precision window).
Prints, per option, perplexity against the bf16-KV reference in % and the mean KL divergence of the
next-token distribution from the reference's over every position.
"""
from __future__ import annotations

import argparse
import ast
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kv_accuracy as ka  # its text sources and windows

WINDOW = 256
OPTIONS = ("kgs=64", "kgs=32", "kgs=16", "kgs=16;vgs=32", "kgs=16;vgs=16", "kgs=8;vgs=32",
           "sm=True", "sm=True;kgs=32", "sm='w';kgs=32;vgs=32", "rot=True", "rot=True;kgs=32", "rot=True;kgs=16",
           "window=32", "kgs=16;vgs=16;window=16", "kbits=0", "vbits=0",
           "kbits=2;vbits=2;kgs=32;vgs=32", "kbits=2;vbits=2;kgs=16;vgs=16", "kbits=2;vbits=2;kgs=8;vgs=8",
           "kbits=2;vbits=2;kgs=16;vgs=16;window=128")


def fake_quant(x: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """x [..., D] through intq's rules (per-token groups of `group` values, float16 scale and zero)."""
    g = x.reshape(*x.shape[:-1], x.shape[-1] // group, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    zero = lo.half().float()
    scale = ((hi - zero) / (2**bits - 1)).clamp(min=2**-14).half().float()
    codes = torch.floor(((g - zero) / scale).clamp(0, 2**bits - 1) + 0.5)
    return (codes * scale + zero).reshape(x.shape)


def hadamard(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


class Attention:
    """transformers attention function: bf16-rounded K/V, then the current option's quantisation."""

    def __init__(self, head_dim: int):
        self.opt: dict[str, Any] | None = None  # None: the reference
        self.smooth: dict[int, torch.Tensor] = {}
        self.amax: dict[int, torch.Tensor] = {}  # collected on the reference run: [Hkv, D] a layer
        self.h = hadamard(head_dim)

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        # query: [B, Hq, T, D], key / value: [B, Hkv, T, D]
        layer = module.layer_idx
        k, v, q = key.bfloat16().float(), value.bfloat16().float(), query
        o = self.opt
        if o is None:
            a = k.abs().amax(dim=2)[0]
            self.amax[layer] = a if layer not in self.amax else torch.maximum(self.amax[layer], a)
            kq, vq = k, v
        else:
            kk, qq = k, q
            if layer in self.smooth:
                s = self.smooth[layer][None, :, None, :]  # [1, Hkv, 1, D]
                kk, qq = k / s, q * s.repeat_interleave(q.shape[1] // k.shape[1], 1)
            if o.get("rot"):
                kk, qq = kk @ self.h, qq @ self.h
            kq = fake_quant(kk, o["kbits"], o["kgs"]) if o["kbits"] else kk
            vv = v @ self.h if o.get("vrot") else v
            vq = fake_quant(vv, o["vbits"], o["vgs"]) if o["vbits"] else vv
            if o.get("vrot"):
                vq = vq @ self.h.T
            q = qq
        g = q.shape[1] // k.shape[1]
        s = (q @ kq.repeat_interleave(g, 1).transpose(-1, -2)) * scaling  # [B, Hq, T, T]
        pos = torch.arange(q.shape[2])
        causal = pos[None, :] > pos[:, None]
        window = o.get("window", 0) if o else 0
        if window:  # the most recent tokens read as bf16
            recent = (pos[:, None] - pos[None, :]) < window
            s = torch.where(recent, (query @ k.repeat_interleave(g, 1).transpose(-1, -2)) * scaling, s)
        p = torch.softmax(s.masked_fill(causal, float("-inf")), -1)
        if window:
            out = (p * recent) @ v.repeat_interleave(g, 1) + (p * ~recent) @ vq.repeat_interleave(g, 1)
        else:
            out = p @ vq.repeat_interleave(g, 1)
        return out.transpose(1, 2).contiguous(), None


def parse_option(text: str) -> dict[str, Any]:
    opt: dict[str, Any] = {"kbits": 4, "kgs": 64, "vbits": 4, "vgs": 64}
    for part in filter(None, text.split(";")):
        key, val = part.split("=", 1)
        opt[key.strip()] = ast.literal_eval(val)  # numbers, True, 'w'
    return opt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("options", nargs="*", default=list(OPTIONS))
    ap.add_argument("--windows", type=int, default=4, help="perplexity windows of 256 tokens a source")
    ap.add_argument("--model", default=None, help="a Hugging Face folder (default: the converted SmolLM2 GGUF)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer

    if args.model is None:
        from radixkv.engine.gguf import cached_hf_folder, smollm2_gguf_path

        args.model = cached_hf_folder(smollm2_gguf_path())
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    attn = Attention(model.config.head_dim)
    AttentionInterface.register("radixkv_fake_int", attn)
    model.set_attn_implementation("radixkv_fake_int")
    n = WINDOW * args.windows
    wins = {"gsm8k": ka.windows(*ka.token_stream(tok, ka.gsm8k_segments(ka.DEFAULT_GSM8K), n), WINDOW, args.windows),
            "sharegpt": ka.windows(*ka.token_stream(tok, ka.sharegpt_segments(ka.DEFAULT_SHAREGPT), n), WINDOW,
                                   args.windows)}

    @torch.no_grad()
    def evaluate() -> tuple[dict[str, float], list[torch.Tensor]]:
        ppl, logprobs = {}, []
        for source, ws in wins.items():
            nll, count = 0.0, 0
            for ids, scored in ws:
                lp = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)  # [T, V]
                logprobs.append(lp)
                mask = torch.tensor(scored[1:])
                nll -= float(lp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0][mask].sum())
                count += int(mask.sum())
            ppl[source] = math.exp(nll / count)
        return ppl, logprobs

    ref, ref_lp = evaluate()
    print(f"bf16 KV: ppl gsm8k {ref['gsm8k']:.3f}, sharegpt {ref['sharegpt']:.3f} "
          f"({args.windows} x {WINDOW} tokens a source)", flush=True)
    weights = {}
    for i, layer in enumerate(model.model.layers):
        w = layer.self_attn.k_proj.weight * layer.input_layernorm.weight[None, :]  # [Hkv * D, H]
        weights[i] = w.norm(dim=1).reshape(-1, model.config.head_dim)
    print("| option | ppl gsm8k | ppl sharegpt | KL |\n|---|---:|---:|---:|")
    for text in args.options:
        opt = parse_option(text)
        sm, alpha = opt.pop("sm", None), opt.pop("alpha", 0.5)
        attn.smooth = {}
        if sm:
            for i, a in (attn.amax if sm is True else weights).items():
                if sm is not True:  # sm='w': tie each RoPE pair, i and i + D / 2
                    half = a.shape[-1] // 2
                    pair = (a[..., :half] ** 2 + a[..., half:] ** 2).sqrt()
                    a = torch.cat([pair, pair], -1)
                a = a.clamp(min=1e-3)
                attn.smooth[i] = (a / a.mean(-1, keepdim=True)) ** alpha
        attn.opt = opt
        t = time.perf_counter()
        ppl, lp = evaluate()
        attn.opt = None
        kl = sum(float((r.exp() * (r - x)).sum(-1).mean()) for r, x in zip(ref_lp, lp)) / len(lp)
        print(f"| {text} | {100 * (ppl['gsm8k'] / ref['gsm8k'] - 1):+.2f}% | "
              f"{100 * (ppl['sharegpt'] / ref['sharegpt'] - 1):+.2f}% | {kl:.4f} |  ({time.perf_counter() - t:.0f} s)",
              flush=True)


if __name__ == "__main__":
    main()
