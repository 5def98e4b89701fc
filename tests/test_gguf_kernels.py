"""GGUF quantized matrices (specdec.kernels.gguf): bitwise dequantization against the gguf
package, products against float64 references in both x modes, and batch invariance, on every
kernel build this CPU runs and on the torch fallback."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from specdec import kernels, ops
from specdec.kernels import gguf as gk

Q = gguf.GGMLQuantizationType
TYPES = ["Q4_K", "Q6_K", "Q5_0", "Q8_0", "Q4_1", "Q4_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K"]
TYPES += ["IQ4_NL", "IQ4_XS", "F16", "BF16", "F32"]
# the types gguf cannot quantize: random blocks, their fp16 scales (gk.SCALE_BYTES) made small
RANDOM_BLOCKS = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"}


def in_features(name: str) -> int:
    """Groups of 256 (K-quants, IQ4_XS): whole groups; 32-blocks: a partial last group of 256;
    floats: any k."""
    if name.endswith("_K") or name == "IQ4_XS":
        return 512
    return 300 if name in ("F16", "BF16", "F32") else 288


def make_raw(name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """uint8 [n, row bytes]: gguf's quantization of random weights, or for the types it cannot
    quantize, random quants with small fp16 scales."""
    rng = np.random.default_rng(seed)
    if name in RANDOM_BLOCKS:
        block, size = gguf.GGML_QUANT_SIZES[Q[name]]
        raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
        for at in gk.SCALE_BYTES[Q[name]]:
            scale = (rng.random((n, k // block, 1)) * 2e-3 + 1e-4).astype(np.float16)
            raw[..., at : at + 2] = scale.view(np.uint8)
        return raw.reshape(n, -1)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    raw = np.ascontiguousarray(gguf.quants.quantize(w, Q[name])).view(np.uint8).reshape(n, -1)
    if name == "Q8_0":  # -128, which gguf never writes but a file may hold
        raw[:, 2::34][:3] = 0x80
    return raw


def make_weight(name: str, n: int = 37, seed: int = 0):
    """(packed weight, its gguf float64 matrix)"""
    k = in_features(name)
    raw = make_raw(name, n, k, seed)
    dense = gguf.quants.dequantize(raw, Q[name]).reshape(n, k)
    return gk.pack(int(Q[name]), torch.from_numpy(raw), n, k), torch.from_numpy(dense).double()


@pytest.fixture(params=[*kernels.BUILDS, "torch"])
def kernels_on(request, monkeypatch):
    """Each build (one this CPU cannot run: its AVX2 emulation, the same bits), and the
    torch fallback (no kernel library)."""
    lib = None
    if request.param != "torch":
        lib, why = kernels.load_build_or_emulation(request.param)
        if lib is None:
            pytest.skip(why)
    monkeypatch.setattr(kernels, "library", lambda: lib)
    yield request.param
    ops.set_num_threads(max(1, torch.get_num_threads()))


def close(y: torch.Tensor, ref: torch.Tensor, rel: float) -> None:
    """y within rel * max|ref| of ref, element-wise."""
    err = (y.double() - ref).abs().max().item()
    assert err <= rel * ref.abs().max().item(), f"error {err:.3g} vs scale {ref.abs().max():.3g}"


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_is_gguf_bitwise(kernels_on, name):
    w, dense = make_weight(name)
    assert torch.equal(gk.dequantize(w).view(torch.int32), dense.float().view(torch.int32))
    rows = torch.tensor([5, 0, 36, 5, 17])
    assert torch.equal(gk.dequantize_rows(w, rows), dense[rows].float())


def test_q4_0_quantization_is_gguf_bitwise(kernels_on):
    """Re-quantizing to Q4_0 (a drafter's matrices) rounds as gguf.quants.quantize does, bit for
    bit: blocks of every scale, an all-zero block, ties between +max and -max (the first
    wins), and values landing exactly between two levels."""
    torch.manual_seed(3)
    x = torch.randn(64, 256) * torch.logspace(-6, 2, 64)[:, None]
    x[1] = 0.0
    x[2, :32] = 0.25
    x[2, 7] = -0.25  # |max| tie: the first (+0.25) sets the sign of d
    x[3, :32] = torch.arange(-16, 16) / 2.0  # many x / d + 8.5 landing on exact .0 / .5
    x[4, :32] = torch.linspace(-1, 1, 32)
    got = gk.quantize_q4_0(x)
    want = gguf.quants.quantize(x.numpy(), Q["Q4_0"])
    assert got.shape == want.shape and np.array_equal(got.numpy(), want)
    with pytest.raises(ValueError, match="multiple of 32"):
        gk.quantize_q4_0(torch.zeros(2, 40))


@pytest.mark.parametrize("name", TYPES)
def test_linear_matches_float64_in_both_x_modes(kernels_on, name):
    """Exact mode: fp32 x times the exact weights. int8_x: the product of x's int8 rounding,
    which is coarse enough to see (floats ignore int8_x: x stays fp32)."""
    torch.manual_seed(0)
    w, dense = make_weight(name)
    x = torch.randn(9, w.in_features)
    x[2, 7] = 30.0  # an outlier coarsens its own block of x only
    exact = gk.linear(x, w, int8_x=False)
    assert exact.dtype == torch.float32 and exact.shape == (9, 37)
    close(exact, x.double() @ dense.T, 1e-5)
    y = gk.linear(x, w)
    xq = gk.quantize_x_reference(x, int(Q[name]))
    close(y, xq @ dense.T, 1e-5)
    if name.startswith("F") or name == "BF16":
        assert torch.equal(xq, x.double()) and torch.equal(y, exact)
    else:
        step = xq.abs().amax() / 254 + 1e-6
        assert 1e-3 < (xq - x.double()).abs().max() <= step  # at most half an int8 step
        assert (y - exact).abs().max() > 1e-4 * exact.abs().max()


@pytest.mark.parametrize("name", TYPES)
def test_bias_and_out_slice(kernels_on, name):
    """bias is added last; ``out`` may be a column slice of a wider tensor (fused q|k|v)."""
    torch.manual_seed(1)
    w, _ = make_weight(name)
    x, bias = torch.randn(5, w.in_features), torch.randn(37)
    for int8_x in (True, False):
        plain = gk.linear(x, w, int8_x=int8_x)
        wide = torch.full((5, 50), 7.0)
        y = gk.linear(x, w, bias, out=wide[:, 6:43], int8_x=int8_x)
        assert y.data_ptr() == wide[:, 6:43].data_ptr()
        torch.testing.assert_close(wide[:, 6:43], plain + bias, rtol=1e-6, atol=1e-6)
        assert (wide[:, :6] == 7.0).all() and (wide[:, 43:] == 7.0).all()
        if kernels_on != "torch":  # our kernels add the bias to the finished sum
            assert torch.equal(wide[:, 6:43], plain + bias)


@pytest.mark.parametrize("int8_x", [True, False])
@pytest.mark.parametrize("name", TYPES)
def test_linear_is_batch_invariant(kernels_on, name, int8_x):
    """Row m's bits do not depend on the other rows of the call (1, 5, 9, 17 rows: different
    x sweeps and k chunks), on threads, or on writing into a slice."""
    if kernels_on == "torch":
        pytest.skip("torch's own matmuls make no such promise")
    torch.manual_seed(2)
    w, _ = make_weight(name, n=45)
    x = torch.randn(17, w.in_features)
    ops.set_num_threads(2)
    y17 = gk.linear(x, w, int8_x=int8_x)
    for m in (0, 4, 16):
        assert torch.equal(gk.linear(x[m : m + 1], w, int8_x=int8_x), y17[m : m + 1])
    for m0 in (0, 3, 8):
        assert torch.equal(gk.linear(x[m0 : m0 + 9], w, int8_x=int8_x), y17[m0 : m0 + 9])
        assert torch.equal(gk.linear(x[m0 : m0 + 5], w, int8_x=int8_x), y17[m0 : m0 + 5])
    ops.set_num_threads(1)
    wide = torch.zeros(17, 60)
    gk.linear(x, w, out=wide[:, 10:55], int8_x=int8_x)
    assert torch.equal(wide[:, 10:55], y17)


@pytest.mark.parametrize("int8_x", [True, False])
def test_a_stack_of_mixed_types_is_its_parts_side_by_side(kernels_on, int8_x):
    """q|k|v of a Q4_K_M layer in one call: each part's columns are its own product's bits,
    the bias is added over the whole row, and rows do not depend on the call's other rows."""
    torch.manual_seed(4)
    names = ["Q4_K", "Q6_K", "Q5_K", "Q8_0", "F16"]  # every form of x: K-quant, 32-block, fp32
    ws = []
    for i, name in enumerate(names):
        raw = make_raw(name, 11 + 8 * i, 512, seed=i)
        ws.append(gk.pack(int(Q[name]), torch.from_numpy(raw), 11 + 8 * i, 512))
    stack = gk.Stack(ws)
    x, bias = torch.randn(9, 512), torch.randn(stack.out_features)
    y = gk.linear_stack(x, stack, bias, int8_x=int8_x)
    parts = torch.cat([gk.linear(x, w, int8_x=int8_x) for w in ws], dim=1)
    if kernels_on == "torch":
        torch.testing.assert_close(y, parts + bias, rtol=1e-6, atol=1e-6)
        return
    assert torch.equal(y, parts + bias)
    for m in (0, 4):
        assert torch.equal(gk.linear_stack(x[m : m + 1], stack, bias, int8_x=int8_x), y[m : m + 1])
    with pytest.raises(ValueError, match="same number of inputs"):
        gk.Stack([ws[0], make_weight("Q4_0")[0]])


def test_quantize_x_reference_rounds_per_block():
    """The int8_x rounding: 32-blocks per row and block of 32 k, steps of amax/127; K-quants
    per 256 k with a step per 32 k of amax * e_j / 4064, at most amax / 4064 above the block's
    own amax/127, so an outlier coarsens little beyond its own block."""
    torch.manual_seed(3)
    x = torch.randn(2, 512)
    x[0, 40] = 100.0  # coarsens k 32..63 (32-blocks) of row 0 only
    xq = gk.quantize_x_reference(x, int(Q.Q8_0))
    for b in range(512 // 32):
        part, ref = xq[:, b * 32 : (b + 1) * 32], x[:, b * 32 : (b + 1) * 32]
        step = ref.abs().amax(-1, keepdim=True).double() / 127
        q = part / step
        assert (q - q.round()).abs().max() < 1e-4 and q.abs().max() <= 127 + 1e-4
        assert ((part - ref.double()).abs() <= step / 2 + 1e-7).all()
    xq = gk.quantize_x_reference(x, int(Q.Q4_K))
    for g in range(2):
        amax = x[:, g * 256 : (g + 1) * 256].abs().amax(-1, keepdim=True).double()
        for j in range(8):
            ks = slice(g * 256 + 32 * j, g * 256 + 32 * (j + 1))
            part, ref = xq[:, ks], x[:, ks].double()
            own = ref.abs().amax(-1, keepdim=True) / 127
            e = torch.ceil(32 * 127 * own / amax).clamp(1, 32)
            step = amax * e / 4064
            q = part / step
            assert (q - q.round()).abs().max() < 1e-4 and q.abs().max() <= 127 + 1e-4
            assert ((part - ref).abs() <= step / 2 + 1e-6).all()
            assert (step <= own + amax / 4064 + 1e-7).all()
    # row 1 has no outlier: its blocks keep steps near their own; row 0's far blocks too
    far = xq[0, 256:] - x[0, 256:].double()
    assert far.abs().max() <= x[0, 256:].abs().max() / 127


def test_bad_input_is_a_clear_error():
    raw = torch.zeros(4, 144, dtype=torch.uint8)
    with pytest.raises(ValueError, match="IQ2_XXS"):
        gk.pack(int(Q.IQ2_XXS), raw, 4, 256)
    with pytest.raises(ValueError, match="Q4_K .* needs 576"):
        gk.pack(int(Q.Q4_K), raw[:3], 4, 256)
    with pytest.raises(ValueError, match="not whole blocks"):
        gk.pack(int(Q.Q4_K), raw, 4, 200)
    w = gk.pack(int(Q.Q4_K), raw, 4, 256)
    with pytest.raises(ValueError, match=r"x must be \[M, 256\]"):
        gk.linear(torch.zeros(2, 128), w)
    assert gk.supported(int(Q.Q6_K)) and not gk.supported(int(Q.IQ2_XXS))
    assert w.nbytes() == 576


TILED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
TILED += ["IQ4_NL", "IQ4_XS"]


def make_tiled(name: str, n: int = 40, seed: int = 0):
    """(file-layout weight, the same in 8-row tiles, gguf's float64 matrix)"""
    w, dense = make_weight(name, n=n, seed=seed)
    return w, gk.repack(w), dense


@pytest.mark.parametrize("name", TILED)
def test_tiles_hold_the_same_weights(kernels_on, name):
    """Repacking rearranges bytes only: every row dequantizes to gguf's values bit for bit,
    in place it reuses the buffer, and where tiles cannot be made the weight is unchanged."""
    w, t, dense = make_tiled(name)
    if kernels_on == "torch":  # only our kernels read tiles, so none are made
        assert t is w
        return
    assert t.qtype == gk.TILED[int(Q[name])] and t.data.shape == w.data.shape
    assert not torch.equal(t.data, w.data) and t.nbytes() == w.nbytes()
    assert "8-row tiles" in gk.type_name(t.qtype) and gk.x_block(t.qtype) == gk.x_block(w.qtype)
    assert torch.equal(gk.dequantize(t).view(torch.int32), dense.float().view(torch.int32))
    rows = torch.tensor([5, 0, 39, 5, 17, 8])
    assert torch.equal(gk.dequantize_rows(t, rows), dense[rows].float())
    same = gk.repack(gk.pack(w.qtype, w.data.clone(), 40, w.in_features), in_place=True)
    assert torch.equal(same.data, t.data)
    odd, _ = make_weight(name, n=37)  # not whole tiles: left as the file has it
    assert gk.repack(odd) is odd
    f16, _ = make_weight("F16", n=40)  # floats have no tiles
    assert gk.repack(f16) is f16


@pytest.mark.parametrize("name", TILED)
def test_tiled_linear_matches_float64_and_is_batch_invariant(kernels_on, name):
    """The tiles' product is the product of x's int8 rounding (as the file layout's), and a
    row's bits do not depend on the call's other rows: every count of 1 to 16 rows (each has
    its own kernel), 17 and 33 (several sweeps of 16), threads, an out slice, a bias."""
    if kernels_on == "torch":
        pytest.skip("no tiles without our kernels")
    torch.manual_seed(5)
    w, t, dense = make_tiled(name, n=48)
    x = torch.randn(33, w.in_features)
    x[2, 7] = 30.0
    ops.set_num_threads(2)
    y = gk.linear(x, t)
    xq = gk.quantize_x_reference(x, int(Q[name]))
    close(y, xq @ dense.T, 1e-5)
    close(y, gk.linear(x, w).double(), 1e-5)  # the file layout's, up to float rounding
    for m0, m in [(0, 1), (32, 1), (16, 17), (1, 17)] + [(17 - m, m) for m in range(2, 17)]:
        assert torch.equal(gk.linear(x[m0 : m0 + m], t), y[m0 : m0 + m]), (m0, m)
    ops.set_num_threads(1)
    bias = torch.randn(48)
    wide = torch.zeros(33, 60)
    gk.linear(x, t, bias, out=wide[:, 5:53])
    assert torch.equal(wide[:, 5:53], y + bias)
    with pytest.raises(ValueError, match="int8 x only"):
        gk.linear(x, t, int8_x=False)


def test_a_stack_mixes_tiles_and_file_layouts(kernels_on):
    """q|k|v as the loader builds it (Q4_K q|k tiled, a Q6_K v tiled, a Q8_0 part as the file
    has it): each part's columns are its own product, rows independent of the call's others."""
    if kernels_on == "torch":
        pytest.skip("no tiles without our kernels")
    torch.manual_seed(6)
    ws = [make_tiled("Q4_K", n=24)[1], make_tiled("Q6_K", n=16, seed=1)[1]]
    raw = make_raw("Q8_0", 8, 512, seed=2)
    ws.append(gk.pack(int(Q.Q8_0), torch.from_numpy(raw), 8, 512))
    stack = gk.Stack(ws)
    x, bias = torch.randn(6, 512), torch.randn(48)
    y = gk.linear_stack(x, stack, bias)
    parts = torch.cat([gk.linear(x, w) for w in ws], dim=1)
    assert torch.equal(y, parts + bias)
    assert torch.equal(gk.linear_stack(x[4:5], stack, bias), y[4:5])
    with pytest.raises(ValueError, match="int8 x only"):
        gk.linear_stack(x, stack, bias, int8_x=False)


@pytest.mark.parametrize("name", TILED)
def test_tiles_give_the_same_bits_in_every_build(monkeypatch, name):
    """The AVX2 path (maddubs, madd with the scales) and the VNNI one (dpbusd, scales applied
    after) compute the same integers and the same float operations: identical bits, for
    5 x rows (unrolled kernels in every build) and 12 (a loop in the AVX2 build)."""
    torch.manual_seed(7)
    w, _, _ = make_tiled(name, n=24)
    x = torch.randn(12, w.in_features)
    ys, missing = {}, []
    for build in kernels.BUILDS:
        lib, why = kernels.load_build_or_emulation(build)
        if lib is None:
            missing.append(f"{build}: {why}")
            continue
        monkeypatch.setattr(kernels, "library", lambda lib=lib: lib)
        tiled = gk.repack(w)
        ys[build] = torch.cat([gk.linear(x[:5], tiled), gk.linear(x, tiled)])
    if len(ys) < 2:
        pytest.skip(f"one build only here ({', '.join(ys) or 'none'}; {'; '.join(missing)})")
    first = next(iter(ys.values()))
    for build, y in ys.items():
        assert torch.equal(y, first), build


def test_emulated_builds_give_the_real_builds_bits(monkeypatch):
    """What lets an AVX2 day test the AVX-512 builds: their SIMDe emulation computes the same
    bits as the real instructions. Checked where the CPU runs an AVX-512 build: every GGUF
    type in the file layout and in tiles, both x modes, 1 and 7 x rows, and the attention."""
    real = [b for b in kernels.supported_builds() if b != "avx2"]
    if not real:
        pytest.skip("this CPU runs no AVX-512 build to hold the emulation against")
    torch.manual_seed(11)
    q, k, v = torch.randn(1, 7, 4, 64), torch.randn(1, 7, 2, 64), torch.randn(1, 7, 2, 64)
    one = torch.zeros(1, dtype=torch.long)
    bf16 = ops.LinearWeight(torch.randn(40, 300).bfloat16(), torch.randn(40))

    def attention():
        kc, vc = torch.zeros(1, 2, 16, 64), torch.zeros(1, 2, 16, 64)
        return ops.attend(q, k, v, kc, vc, one, one, one + 7, None, 0.125)

    for build in real:
        outs = []
        for emulated in (False, True):
            lib, why = kernels.load_build(build, emulated=emulated)
            if lib is None:
                pytest.skip(why)
            monkeypatch.setattr(kernels, "library", lambda lib=lib: lib)
            got, g = [], torch.Generator().manual_seed(2)
            for name in TYPES:
                w, _ = make_weight(name, n=40)
                x = torch.randn(7, w.in_features, generator=torch.Generator().manual_seed(1))
                for m in (1, 7):
                    got += [gk.linear(x[:m], w, int8_x=i8) for i8 in (True, False)]
                    if name in TILED:
                        got.append(gk.linear(x[:m], gk.repack(w)))
            got += [attention(), ops.linear(torch.randn(5, 300, generator=g), bf16)]
            outs.append(got)
        for i, (a, b) in enumerate(zip(*outs)):
            assert torch.equal(a, b), f"{build}: output {i} differs from its emulation"
