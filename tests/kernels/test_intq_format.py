"""kernels/intq.py: the INT4 / INT2 KV format (group-wise asymmetric codes in bit-planes, float16 (scale, zero))."""
import pytest
import torch
from radixkv.kernels.intq import (
    FP16_MAX,
    SCALE_MIN,
    bits_of,
    dequantize_int,
    format_error,
    pack,
    packed_dim,
    qmax,
    quantize_int,
    unpack,
)

FORMATS = [(4, 1), (4, 2), (4, 4), (4, 8), (2, 1), (2, 2), (2, 4), (2, 8)]  # (bits, groups a row)


def _bound(scales, bits):
    """Largest error a value may have: half a step, the clamp where the float16 scale rounded down
    (qmax steps of its rounding), and the float16 rounding of the zero."""
    s, z = scales[..., 0].float(), scales[..., 1].float()
    return s * (0.5 + qmax(bits) * 2.0**-11) + z.abs() * 2.0**-11 + 1e-7


@pytest.mark.parametrize("bits, groups", FORMATS)
def test_round_trip_error_is_within_half_a_step(bits, groups):
    gen = torch.Generator().manual_seed(bits * 10 + groups)
    x = torch.randn(64, 3, 32, generator=gen) * torch.rand(64, 3, 1, generator=gen) * 4 + 1.5  # offsets, scales
    packed, scales = quantize_int(x, bits, groups)
    assert packed.dtype == torch.uint8 and packed.shape == (64, 3, packed_dim(32, bits))
    assert scales.dtype == torch.float16 and scales.shape == (64, 3, groups, 2)
    y = dequantize_int(packed, scales, bits)  # [64, 3, 32] fp32
    err = (y - x).abs().reshape(64, 3, groups, -1)
    assert (err <= _bound(scales, bits)[..., None]).all()
    # the grid spans the group: its max maps to qmax (its min may sit above code 0 where the group's
    # range is below float16's rounding of its zero)
    codes = unpack(packed, bits).reshape(64, 3, groups, -1)
    assert (codes.amax(-1) == qmax(bits)).float().mean() > 0.9


def test_pack_and_unpack_are_inverse_bit_planes():
    codes = torch.arange(16, dtype=torch.int32).repeat(2)  # [32]: value e = code e % 16
    packed = pack(codes, 4)  # 16 bytes: byte j = value j (low nibble) | value j + 16 (high nibble)
    assert packed.tolist() == [j | (j << 4) for j in range(16)]
    c2 = torch.tensor([0, 1, 2, 3, 3, 2, 1, 0], dtype=torch.int32)
    assert pack(c2, 2).tolist() == [0 | 2 << 2 | 3 << 4 | 1 << 6, 1 | 3 << 2 | 2 << 4]  # 4 planes: e = 2 p + j
    gen = torch.Generator().manual_seed(0)
    for bits in (4, 2):
        c = torch.randint(0, qmax(bits) + 1, (5, 48), generator=gen, dtype=torch.int32)
        assert torch.equal(unpack(pack(c, bits), bits), c)


def test_constant_rows_are_exact_and_never_nan():
    x = torch.full((4, 2, 16), 3.25)
    x[1] = 0.0
    x[2, :, 8:] = -7.0  # second group constant, first group 3.25
    for bits, groups in FORMATS:
        packed, scales = quantize_int(x, bits, groups)
        y = dequantize_int(packed, scales, bits)
        assert torch.isfinite(scales.float()).all() and (scales[..., 0].float() >= SCALE_MIN).all()
        if groups == 2 or (groups == 1 and bits == 4):
            assert torch.equal(y[[0, 1, 3]], x[[0, 1, 3]])
        if groups >= 2:
            assert torch.equal(y, x)


def test_values_beyond_float16_saturate():
    x = torch.tensor([[1e6, -1e6, 3.0, 0.0]])
    packed, scales = quantize_int(x, 4, 1)
    assert torch.isfinite(scales.float()).all() and scales[0, 0, 1] == -FP16_MAX
    y = dequantize_int(packed, scales, 4)
    assert y[0, 1] == -FP16_MAX and torch.isfinite(y).all()


def test_int2_groups_of_32_are_more_accurate_than_64():
    """The group sizes KVStore uses (radixkv.plan.kv_int_groups) against the next coarser ones."""
    x = torch.randn(2048, 128, generator=torch.Generator().manual_seed(0))

    def rel(bits, groups):
        p, s = quantize_int(x, bits, groups)
        return float((dequantize_int(p, s, bits) - x).norm() / x.norm())

    assert rel(2, 4) < 0.9 * rel(2, 2) < 0.9 * rel(2, 1)  # measured 0.39, 0.45, 0.50
    assert rel(4, 2) < 0.95 * rel(4, 1) and rel(4, 2) < 0.1  # 0.090, 0.100


def test_format_errors_name_the_problem():
    assert format_error(128, 4, 2) is None and format_error(128, 2, 4) is None
    assert "bits" in format_error(128, 3, 1)
    assert "multiple of 4" in format_error(18, 2, 1)
    assert format_error(128, 4, 4) is None and format_error(64, 4, 4) is None  # groups of a half plane
    assert "power of two" in format_error(128, 4, 3) and format_error(24, 4, 16) is not None
    with pytest.raises(ValueError, match="quantize_int: .*groups"):
        quantize_int(torch.zeros(2, 64), 4, 3)
    assert (bits_of(64, 128), bits_of(32, 128), bits_of(48, 128)) == (4, 2, 0)


def test_int4_groups_of_16_tame_outlier_channels():
    """KVStore's int4 groups at head_dim 64 (radixkv.plan.kv_int_groups: 4 of 16): keys with a few large
    channels (as SmolLM2-135M's) lose far less than in one group of 64, where the outliers set every step."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4096, 64, generator=gen)
    x[:, [5, 37]] *= 12.0  # two outlier channels

    def rel(groups):
        p, s = quantize_int(x, 4, groups)
        return float((dequantize_int(p, s, 4) - x).norm() / x.norm())

    assert rel(4) < 0.8 * rel(2) < 0.8 * rel(1)  # measured 0.076, 0.110, 0.160
