"""Correctness phase of bench_kernels.py: store_kv / paged_decode / paged_prefill against
reference.py on fresh random inputs (ragged rows, several page sizes, KV dtypes and split
counts), with NaN-poisoned outputs so that an unwritten row fails."""
from __future__ import annotations

import torch

from kernel_common import D, FP8, HKV, HQ, PAGE, ragged_kv, rel_err


def correctness(ops, ref, dev: torch.device, gen: torch.Generator, smoke: bool) -> list[dict]:
    """Kernels vs reference.py on fresh random inputs with NaN-poisoned outputs."""
    results = []
    hgen = torch.Generator().manual_seed(1)  # host-side sizes
    max_len, max_new, n_rows = (40, 12, 2) if smoke else (700, 200, 5)
    # store_kv: bf16 exact, fp8 bit-exact vs torch quantisation, also in KVStore's FP8 layout
    # (head-major pages, float16 scales)
    from radixkv.kv_store import head_major_pages, head_major_scales

    for name, dt in (("bf16", torch.bfloat16), *FP8.items(), *((f"{n} kvstore", d) for n, d in FP8.items())):
        T, P = (20, 4) if smoke else (300, 64)
        k = torch.randn(T, HKV, D, device=dev, generator=gen) * 4
        v = torch.randn(T, HKV, D, device=dev, generator=gen)
        slots = torch.randperm(P * PAGE, device=dev, generator=gen)[:T]
        fp8 = dt in FP8.values()
        if name.endswith("kvstore"):
            caches = [head_major_pages((P, PAGE, HKV, D), dt, dev) for _ in range(4)]
            sc = [head_major_scales((P, PAGE, HKV, D), dev) for _ in range(4)]
        else:
            caches = [torch.zeros(P, PAGE, HKV, D, device=dev).to(dt) for _ in range(4)]
            sc = [torch.zeros(P, PAGE, HKV, device=dev) for _ in range(4)] if fp8 else [None] * 4
        src_k, src_v = (k, v) if fp8 else (k.to(dt), v.to(dt))
        ops.store_kv(src_k, src_v, caches[0], caches[1], slots, k_scale=sc[0], v_scale=sc[1])
        ref.store_kv_ref(src_k, src_v, caches[2], caches[3], slots, k_scale=sc[2], v_scale=sc[3])
        diff = max(float((caches[i].contiguous().view(torch.uint8) != caches[i + 2].contiguous().view(torch.uint8))
                         .float().mean()) for i in (0, 1))
        scale_rel = max(float(((sc[i].float() - sc[i + 2].float()).abs() / sc[i + 2].float().abs().clamp(min=1e-30))
                              .max()) for i in (0, 1)) if fp8 else 0.0
        ok = diff == 0.0 and scale_rel == 0.0
        results.append({"check": f"store_kv {name}", "ok": ok, "mismatch_frac": diff, "scale_rel_diff": scale_rel})
    # attention on ragged random shapes, several page sizes and splits
    for page_size in ((16,) if smoke else (1, 16, 32)):
        for kv_name in ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2"):
            cdt = {"bf16": torch.bfloat16, "fp16": torch.float16, **FP8}[kv_name]
            qdt = torch.float16 if kv_name == "fp16" else torch.bfloat16
            lens = torch.randint(1, max_len, (n_rows,), generator=hgen).tolist()
            q_lens = [min(n, int(x)) for n, x in zip(lens, torch.randint(1, max_new, (n_rows,), generator=hgen))]
            kq, vq, ks, vs, table, seq = ragged_kv(ref, lens, page_size, cdt, 7, dev, gen)
            ql = torch.tensor(q_lens, dtype=torch.int32, device=dev)
            qs = (torch.cumsum(ql, 0) - ql).to(torch.int32)
            q = torch.randn(sum(q_lens), HQ, D, device=dev, generator=gen).to(qdt)
            out = torch.full_like(q, float("nan"))
            ops.paged_prefill(q, kq, vq, table, seq, qs, ql, k_scale=ks, v_scale=vs, out=out)
            want = ref.paged_prefill_ref(q.float(), kq, vq, table, seq, qs, ql, k_scale=ks, v_scale=vs)
            e = rel_err(out, want.double())
            results.append({"check": f"prefill page{page_size} {kv_name}", "ok": e < 1e-2, "rel_err": e})
            qd = torch.randn(n_rows, HQ, D, device=dev, generator=gen).to(qdt)
            want = ref.paged_decode_ref(qd.float(), kq, vq, table, seq, k_scale=ks, v_scale=vs).double()
            for splits in (1, 5, 32):
                out = torch.full_like(qd, float("nan"))
                ops.paged_decode(qd, kq, vq, table, seq, k_scale=ks, v_scale=vs, num_splits=splits, out=out)
                e = rel_err(out, want)
                results.append({"check": f"decode page{page_size} {kv_name} splits{splits}", "ok": e < 1e-2, "rel_err": e})
            if kv_name.startswith("fp8") and page_size == 16:  # FP8 decode kernel at GQA groups 1 and 16, fp16 q
                for hq, qdt in ((HKV, torch.bfloat16), (16 * HKV, torch.float16)):
                    qg = torch.randn(n_rows, hq, D, device=dev, generator=gen).to(qdt)
                    want = ref.paged_decode_ref(qg.float(), kq, vq, table, seq, k_scale=ks, v_scale=vs).double()
                    out = torch.full_like(qg, float("nan"))
                    ops.paged_decode(qg, kq, vq, table, seq, k_scale=ks, v_scale=vs, num_splits=3, out=out)
                    e = rel_err(out, want)
                    results.append({"check": f"decode page16 {kv_name} group{hq // HKV} {qdt}", "ok": e < 1e-2, "rel_err": e})
    return results
