"""INT4 / INT2 KV format: group-wise asymmetric quantisation, packed bit-planes, float16 (scale, zero).

The format (shared by store_kv, paged_decode, paged_prefill, their twins in reference_attention.py and the tests):

    pages   uint8 [num_pages, page_size, Hkv, D * bits / 8]      bits = 4 (int4) or 2 (int2)
    scales  float16 [num_pages, page_size, Hkv, G, 2]             (scale, zero) per group, one tensor for
                                                                  K (k_scale=) and one for V (v_scale=)

- Groups: every (token, KV head) row of D values is cut into G groups of D / G consecutive values, for K
  and for V alike (per-token groups). A stored value means `code * scale + zero`, codes in
  [0, 2^bits - 1]. Per-token groups are written once with their token and never change, so a page shared
  by many requests through the prefix tree stays valid for all of them. KIVI quantises keys per channel
  (statistics over many tokens), which would need a page's channel statistics while the page fills
  during decode and re-quantisation of shared pages; KIVI's full-precision window of recent tokens is
  not built either: pages are written once and shared, and a window would be a second, mutable store
  beside the pages.
- Quantisation (round to nearest, asymmetric): zero = min of the group rounded to float16;
  scale = (max - zero) / (2^bits - 1) rounded to float16; code = floor(clamp((x - zero) / scale, 0, qmax)
  + 0.5). The arithmetic is float32 and the row is quantised by the scale and zero AS STORED, so a kernel
  and a twin that follow it agree bit for bit. A constant group gets scale = 2^-14 (float16's smallest
  normal) and codes 0: it is stored exactly as its (float16) value, never NaN. zero and scale stop at
  float16's +-65504: values beyond saturate.
- Packing: bit-planes. Byte j of a row holds values p * W + j for the planes p = 0 .. 8 / bits - 1
  (W = D * bits / 8 bytes a row), value p * W + j in bits [bits * p, bits * p + bits). Unpacking a whole
  packed row is one shift and mask per plane on the loaded bytes and gives W consecutive values, which
  the kernels dot with the matching W columns of q (no interleaving shuffle).
- G: a power of two dividing D, either a divisor of 8 / bits (a group is a whole number of bit-planes:
  one (scale, zero) a plane, which paged_decode folds into its scores) or a multiple of it (a plane is
  G * bits / 8 whole groups of D / G values: the kernels gather each column's (scale, zero) and
  dequantise the plane in registers before its dot). The kernels read G from the scales' shape.
  radixkv's KVStore uses radixkv.plan.kv_int_groups: int4 groups of 16 values up to head_dim 64
  (4 groups at D = 64: 32 packed bytes + 4 x 4 = 48 bytes a token-head's K (or V) row, bf16: 128), 2 groups
  of 64 at D = 128 (64 + 2 x 4 = 72 bytes, bf16: 256, 3.6x less); int2 groups of 32 (32 + 4 x 4 = 48 bytes
  at D = 128). Why 16 at D = 64: SmolLM2-135M's keys (head_dim 64) carry a few outlier channels; one group
  of 64 a key row gave +14-28% perplexity against bf16 KV, groups of 16 bring it near 3%
  (benchmarks/RESULTS.md). int2 groups of 64 would take 40 bytes at D = 128, but their error on random
  rows is ~15% larger (0.45 against 0.39 relative; tests/kernels/test_intq_format.py checks the order).

No Triton here: reference_attention.py and the CPU engine import this module.
"""
from __future__ import annotations

import torch
from torch import Tensor

INT_BITS = (4, 2)
SCALE_DTYPE = torch.float16
FP16_MAX = 65504.0
SCALE_MIN = 2.0**-14  # float16's smallest normal: the scale of a constant group


def planes(bits: int) -> int:
    """Values a byte holds (2 for int4, 4 for int2)."""
    return 8 // bits


def qmax(bits: int) -> int:
    """Largest code (15 for int4, 3 for int2)."""
    return (1 << bits) - 1


def packed_dim(head_dim: int, bits: int) -> int:
    """Bytes of one packed row of head_dim values."""
    return head_dim * bits // 8


def format_error(head_dim: int, bits: int, num_groups: int) -> str | None:
    """Why (head_dim, bits, num_groups) is not a valid format, or None if it is."""
    if bits not in INT_BITS:
        return f"bits must be 4 or 2, got {bits}"
    if head_dim < 1 or head_dim % planes(bits):
        return f"head_dim {head_dim} is not a multiple of {planes(bits)} (values a byte holds at {bits} bits)"
    n = planes(bits)
    if num_groups < 1 or num_groups & (num_groups - 1) or head_dim % num_groups or (
            num_groups > n and (head_dim // n) % (num_groups // n)):
        return (f"{num_groups} groups: an int{bits} row of {head_dim} values has a power of two of groups "
                f"dividing {head_dim}: whole bit-planes (1 to {n}) or whole groups a plane (a multiple of {n})")
    return None


def groups_per_plane(bits: int, num_groups: int) -> int:
    """Groups one bit-plane holds: 1 when a group is one or more whole planes, else num_groups / planes."""
    return max(1, num_groups // planes(bits))


def planes_per_group(bits: int, num_groups: int) -> int:
    """Bit-planes one group spans: 8 / bits / num_groups, or 1 when a plane holds several groups."""
    return max(1, planes(bits) // num_groups)


def bits_of(packed: int, head_dim: int) -> int:
    """The bits a value of a uint8 cache with rows of `packed` bytes holds for head_dim values
    (4 or 2); 0 when neither fits."""
    for bits in INT_BITS:
        if packed * 8 == head_dim * bits:
            return bits
    return 0


def pack(codes: Tensor, bits: int) -> Tensor:
    """codes: integer [..., D] in [0, qmax] -> uint8 [..., D * bits / 8] (bit-planes, see module doc)."""
    d = codes.shape[-1]
    n = planes(bits)
    c = codes.to(torch.int32).reshape(*codes.shape[:-1], n, d // n)  # [..., planes, W]
    shifts = torch.arange(n, dtype=torch.int32, device=codes.device) * bits
    return (c << shifts[:, None]).sum(dim=-2).to(torch.uint8)


def unpack(packed: Tensor, bits: int) -> Tensor:
    """uint8 [..., W] -> codes int32 [..., W * 8 / bits] (pack's inverse)."""
    n = planes(bits)
    shifts = torch.arange(n, dtype=torch.int32, device=packed.device) * bits
    c = (packed.to(torch.int32).unsqueeze(-2) >> shifts[:, None]) & qmax(bits)  # [..., planes, W]
    return c.reshape(*packed.shape[:-1], n * packed.shape[-1])


def quantize_int(x: Tensor, bits: int, num_groups: int) -> tuple[Tensor, Tensor]:
    """x: [..., D] -> (packed uint8 [..., D * bits / 8], scales float16 [..., num_groups, 2]).

    scales[..., g, 0] is group g's scale, scales[..., g, 1] its zero (see the module doc for the rules,
    which store_kv's kernel follows bit for bit)."""
    d = x.shape[-1]
    err = format_error(d, bits, num_groups)
    if err:
        raise ValueError(f"quantize_int: {err}")
    g = x.float().reshape(*x.shape[:-1], num_groups, d // num_groups)  # [..., G, D / G]
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)  # [..., G]
    zero = lo.clamp(-FP16_MAX, FP16_MAX).to(SCALE_DTYPE).float()
    # a tensor divisor: torch on CUDA divides by a Python scalar through its reciprocal, an ulp off
    scale = ((hi - zero) / torch.full_like(hi, float(qmax(bits)))).clamp(SCALE_MIN, FP16_MAX)
    scale = scale.to(SCALE_DTYPE).float()
    codes = ((g - zero[..., None]) / scale[..., None]).clamp(0.0, float(qmax(bits))) + 0.5
    packed = pack(codes.to(torch.int32).reshape(x.shape), bits)  # truncation = floor (non-negative)
    return packed, torch.stack((scale, zero), dim=-1).to(SCALE_DTYPE)


def dequantize_int(packed: Tensor, scales: Tensor, bits: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """packed uint8 [..., W], scales [..., G, 2] -> values [..., W * 8 / bits] in dtype (fp32 math)."""
    math_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    codes = unpack(packed, bits).to(math_dtype)  # [..., D]
    num_groups = scales.shape[-2]
    g = codes.reshape(*codes.shape[:-1], num_groups, codes.shape[-1] // num_groups)  # [..., G, D / G]
    s = scales.to(math_dtype)
    return (g * s[..., 0:1] + s[..., 1:2]).reshape(codes.shape).to(dtype)
