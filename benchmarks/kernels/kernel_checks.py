"""Correctness phase of bench_kernels.py: store_kv / paged_decode / paged_prefill against
reference.py on fresh random inputs (ragged rows, several page sizes, KV dtypes and split
counts), with NaN-poisoned outputs so that an unwritten row fails. INT4 / INT2 pages too
(int_checks; the helpers that quantise pools and check rows over dequantised INT values live here
beside them and are imported by bench_kernels.py)."""
from __future__ import annotations

import itertools
import random

import torch
from kernel_common import FP8, HKV, HQ, PAGE, D, Pool, RaggedKV, dense_ref, ragged_kv, rel_err, store_pool

INT = {"int4": 4, "int2": 2}  # INT KV dtypes -> bits (radixkv.kernels.intq)
# int_checks' formats: (tag, bits, head_dim); at head_dim 64 KVStore's int4 groups (16 values) are smaller than a
# bit-plane, the kernels' per-column (scale, zero) path (radixkv.plan.kv_int_groups)
INT_FORMATS = (("int4", 4, D), ("int2", 2, D), ("int4 d64", 4, 64))


# ----------------------------------------------------------------------------- INT pools and oracles
def int_pages(shape: tuple[int, ...], bits: int, dev: torch.device) -> tuple[torch.Tensor, ...]:
    """Empty INT pages and (scale, zero) tensors for caches of shape [P, S, HKV, D] in KVStore's layout
    (head-major, plan.kv_int_groups groups): (k, v, k_scale, v_scale)."""
    from radixkv.engine.kv_store import head_major_int_scales, head_major_pages
    from radixkv.plan import kv_int_groups

    packed = (*shape[:3], shape[3] * bits // 8)
    groups = kv_int_groups(shape[3], f"int{bits}")
    return (*(head_major_pages(packed, torch.uint8, dev) for _ in range(2)),
            *(head_major_int_scales(packed, groups, dev) for _ in range(2)))


def quantize_pool_int(pool: Pool, bits: int, ops) -> tuple[torch.Tensor, ...]:
    """INT copy of a pool written by the store_kv kernel, in KVStore's layout: (k, v, k_scale, v_scale)."""
    return store_pool(pool, int_pages(pool.k.shape, bits, pool.k.device), ops)


def ragged_kv_int(lens: list[int], page_size: int, bits: int, spare_pages: int, dev: torch.device,
                  gen: torch.Generator, head_dim: int = D) -> RaggedKV:
    """kernel_common.ragged_kv's random rows quantised to INT pages with intq.quantize_int (torch), in
    KVStore's layout."""
    from radixkv.kernels.intq import quantize_int

    rk = ragged_kv(lens, page_size, torch.float32, spare_pages, dev, gen, head_dim)
    kq, vq, ks, vs = int_pages(rk.k.shape, bits, dev)
    for src, pages, scales in ((rk.k, kq, ks), (rk.v, vq, vs)):
        codes, pairs = quantize_int(src, bits, scales.shape[3])
        pages.copy_(codes)
        scales.copy_(pairs)
    return RaggedKV(kq, vq, ks, vs, rk.page_table, rk.seq_lens)


def check_rows_int(out: torch.Tensor, q: torch.Tensor, pool: Pool, intq: tuple[torch.Tensor, ...], bits: int,
                   rows: list[int], q_lens: list[int], sm_scale: float) -> float:
    """Relative error of `out` on the given rows vs fp64 attention over the INT pages' dequantised values
    (intq = (k, v, k_scale, v_scale) of the pool's pages): the kernel's own error."""
    from radixkv.kernels.intq import dequantize_int

    kq, vq, ks, vs = intq
    starts = [sum(q_lens[:b]) for b in range(len(q_lens))]
    outs, refs = [], []
    for b in rows:
        n = int(pool.seq_lens[b])
        pages = pool.page_table[b, : -(-n // PAGE)].long()
        k, v = (dequantize_int(c[pages], x[pages], bits, torch.float64).reshape(-1, HKV, c.shape[3] * 8 // bits)[:n]
                for c, x in ((kq, ks), (vq, vs)))
        s0, m = starts[b], q_lens[b]
        refs.append(dense_ref(q[s0:s0 + m], k, v, sm_scale))
        outs.append(out[s0:s0 + m])
    return rel_err(torch.cat(outs), torch.cat(refs))


def int_checks(ops, ref, dev: torch.device, gen: torch.Generator, smoke: bool) -> list[dict]:
    """INT4 / INT2: store_kv bit-exact against store_kv_ref (codes, scales and zeros; bf16 and fp16
    sources, KVStore's layout); paged_prefill / paged_decode against the twins over the same pages
    (bf16 and fp16 q, page sizes 1 / 16 / 32, splits 1 / 5 / 32, GQA groups 1 / 4 / 16), NaN-poisoned; at
    head_dim D and, for int4, 64 (INT_FORMATS)."""
    results = []
    hgen = torch.Generator().manual_seed(2)
    max_len, max_new, n_rows = (40, 12, 2) if smoke else (700, 200, 5)
    for name, bits, d in INT_FORMATS:
        for src_dt in ((torch.float16,) if smoke else (torch.bfloat16, torch.float16)):
            T, P = (20, 4) if smoke else (300, 64)
            k = (torch.randn(T, HKV, d, device=dev, generator=gen) * 4 + 1).to(src_dt)
            v = torch.randn(T, HKV, d, device=dev, generator=gen).to(src_dt)
            k[0, 0] = 1.5  # a constant row
            slots = torch.randperm(P * PAGE, device=dev, generator=gen)[:T]
            mine, twin = int_pages((P, PAGE, HKV, d), bits, dev), int_pages((P, PAGE, HKV, d), bits, dev)
            ops.store_kv(k, v, mine[0], mine[1], slots, k_scale=mine[2], v_scale=mine[3])
            ref.store_kv_ref(k, v, twin[0], twin[1], slots, k_scale=twin[2], v_scale=twin[3])
            diff = max(float((a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).float().mean())
                       for a, b in zip(mine, twin))
            results.append({"check": f"store_kv {name} {str(src_dt)[6:]}", "ok": diff == 0.0, "mismatch_frac": diff})
    for page_size in ((16,) if smoke else (1, 16, 32)):
        for name, bits, d in INT_FORMATS:
            lens = torch.randint(1, max_len, (n_rows,), generator=hgen).tolist()
            q_lens = [min(n, int(x)) for n, x in zip(lens, torch.randint(1, max_new, (n_rows,), generator=hgen))]
            kq, vq, ks, vs, table, seq = ragged_kv_int(lens, page_size, bits, 7, dev, gen, d)
            ql = torch.tensor(q_lens, dtype=torch.int32, device=dev)
            qs = (torch.cumsum(ql, 0) - ql).to(torch.int32)
            for qdt in ((torch.float16,) if smoke else (torch.bfloat16, torch.float16)):
                tag = f"page{page_size} {name} {str(qdt)[6:]}"
                q = torch.randn(sum(q_lens), HQ, d, device=dev, generator=gen).to(qdt)
                out = torch.full_like(q, float("nan"))
                ops.paged_prefill(q, kq, vq, table, seq, qs, ql, k_scale=ks, v_scale=vs, out=out)
                want = ref.paged_prefill_ref(q.float(), kq, vq, table, seq, qs, ql, k_scale=ks, v_scale=vs)
                e = rel_err(out, want.double())
                results.append({"check": f"prefill {tag}", "ok": e < 1e-2, "rel_err": e})
                for hq in ((HQ,) if smoke or page_size != 16 else (HKV, HQ, 16 * HKV)):
                    qd = torch.randn(n_rows, hq, d, device=dev, generator=gen).to(qdt)
                    want = ref.paged_decode_ref(qd.float(), kq, vq, table, seq, k_scale=ks, v_scale=vs).double()
                    for splits in ((1, 5) if smoke else (1, 5, 32)):
                        out = torch.full_like(qd, float("nan"))
                        ops.paged_decode(qd, kq, vq, table, seq, k_scale=ks, v_scale=vs, num_splits=splits, out=out)
                        e = rel_err(out, want)
                        results.append({"check": f"decode {tag} group{hq // HKV} splits{splits}", "ok": e < 1e-2,
                                        "rel_err": e})
    return results


def correctness(ops, ref, dev: torch.device, gen: torch.Generator, smoke: bool) -> list[dict]:
    """Kernels vs reference.py on fresh random inputs with NaN-poisoned outputs."""
    results = []
    hgen = torch.Generator().manual_seed(1)  # host-side sizes
    max_len, max_new, n_rows = (40, 12, 2) if smoke else (700, 200, 5)
    # store_kv: bf16 exact, fp8 bit-exact vs torch quantisation, also in KVStore's FP8 layout
    # (head-major pages, float16 scales)
    from radixkv.engine.kv_store import head_major_pages, head_major_scales

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
            kq, vq, ks, vs, table, seq = ragged_kv(lens, page_size, cdt, 7, dev, gen)
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
    results += int_checks(ops, ref, dev, gen, smoke)
    if not smoke:
        results += ragged_extend_cases(ops, ref, dev, gen)
    return results


def ragged_extend_cases(ops, ref, dev: torch.device, gen: torch.Generator, n_cases: int = 16) -> list[dict]:
    """paged_prefill's own dispatch (on sm_90: paged_prefill_hopper for more than HOPPER_PREFILL_MIN_NEW
    new tokens, which each case's longest row exceeds) against the Triton kernel at an explicit tile and
    fp64 attention, on random ragged batches: 16-bit dtypes, page sizes 1, 3, 4, 8, 16, 24, 32, 64, GQA
    groups 1-8, head-major pages, q/out as strided views of packed tensors, rows of 0-1000 new tokens
    placed with gaps. Rows outside the batch and heads outside the view must stay NaN; on sm_90 the
    Gluon kernel must be the one that ran. bit_identical says whether it matched the Triton kernel exactly."""
    from radixkv.kernels import dispatch
    from radixkv.kernels.dispatch import HOPPER_PREFILL_MIN_NEW, hopper_prefill_enabled, hopper_prefill_supported
    from radixkv.kernels.launch import KernelConfig

    from radixkv.engine.kv_store import head_major_pages

    rng = random.Random(3)
    triton_tile = KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3)
    want_gluon = dev.type == "cuda" and hopper_prefill_enabled() and dispatch._gluon_hopper_gpu(dev.index or 0)
    results = []
    for case in range(n_cases):
        dt = rng.choice([torch.bfloat16, torch.float16])
        page, hkv, group = rng.choice([1, 3, 4, 8, 16, 24, 32, 64]), rng.choice([1, 2, 8]), rng.choice([1, 4, 8])
        hq, nb = hkv * group, rng.randint(1, 6)
        q_lens = [rng.choice([0, 1, 37, 65, 100, 129, 257, 640, 1000]) for _ in range(nb)]
        if max(q_lens) <= HOPPER_PREFILL_MIN_NEW:
            q_lens[0] = rng.choice([HOPPER_PREFILL_MIN_NEW + 1, 100, 300])
        lens = [n + rng.choice([0, 0, 1, 63, 500, 2100]) for n in q_lens]
        need = [max(1, -(-n // page)) for n in lens]
        shape = (sum(need) + 5, page, hkv, D)
        if rng.random() < 0.5:  # KVStore's layout
            kc, vc = (head_major_pages(shape, dt, dev).copy_(torch.randn(shape, device=dev, generator=gen))
                      for _ in range(2))
        else:
            kc, vc = (torch.randn(shape, device=dev, generator=gen).to(dt) for _ in range(2))
        perm = torch.randperm(shape[0], device=dev, generator=gen).to(torch.int32)
        table = torch.full((nb, max(need) + rng.randint(0, 3)), 10**6, dtype=torch.int32, device=dev)  # junk past need
        for b, (lo, n) in enumerate(zip([0, *itertools.accumulate(need)], need)):
            table[b, :n] = perm[lo:lo + n]
        starts, t = [], 0
        for n in q_lens:
            t += rng.randint(0, 5)
            starts.append(t)
            t += n
        T = t + 3
        packed = torch.randn(T, hq + 2 * hkv, D, device=dev, generator=gen).to(dt)  # [T, q | k | v heads, D]
        q = packed[:, :hq] if rng.random() < 0.5 else packed[:, :hq].contiguous()
        seq, qs, ql = (torch.tensor(x, dtype=torch.int32, device=dev) for x in (lens, starts, q_lens))
        sm_scale = 0.07 if case % 3 == 0 else None
        outs = []
        for config in (None, triton_tile):
            buf = torch.full((T, hq + 2 * hkv, D), float("nan"), device=dev, dtype=dt)
            ops.paged_prefill(q, kc, vc, table, seq, qs, ql, sm_scale=sm_scale, out=buf[:, hkv:hkv + hq], config=config)
            outs.append(buf)
        want = ref.paged_prefill_ref(q.double(), kc, vc, table, seq, qs, ql, sm_scale=sm_scale)  # fp64 throughout
        rows = torch.zeros(T, dtype=torch.bool, device=dev)
        for s, n in zip(starts, q_lens):
            rows[s:s + n] = True
        mine, triton_out = (buf[:, hkv:hkv + hq][rows] for buf in outs)
        untouched = bool(torch.isnan(outs[0][~rows]).all() and torch.isnan(outs[0][:, :hkv]).all()
                         and torch.isnan(outs[0][:, hkv + hq:]).all())
        e, e_triton = rel_err(mine, want[rows]), rel_err(triton_out, want[rows])
        gluon = hopper_prefill_supported(q, kc, vc, outs[0][:, hkv:hkv + hq], max(q_lens))
        max_diff = float((mine.float() - triton_out.float()).abs().max())
        results.append({"check": f"prefill ragged {case} {'gluon' if gluon else 'triton'} page{page} group{group} "
                                 f"{str(dt)[6:]}",
                        "ok": untouched and gluon == want_gluon and e < 1e-2 and e <= 1.5 * e_triton + 1e-4,
                        "rel_err": e, "rel_err_triton_tile": e_triton, "max_diff_triton_tile": max_diff,
                        "bit_identical": max_diff == 0.0})
    return results
