"""Our CPU matrix kernels directly: every weight format against a float64 reference, and batch
invariance (a row's output bits do not depend on M, the tile that computed it, or threads)."""

from __future__ import annotations

import pytest
import torch

from specdec import kernels, ops
from specdec.quantize import quantize_int4, quantize_int8

DTYPES = ["f32", "bf16", "int8", "int4", "int4q"]  # int4q: int4 weights, int8 x where VNNI


def make_weight(dtype: str, n: int, k: int, bias: bool = True) -> ops.LinearWeight:
    w = torch.randn(n, k) * 0.05
    b = torch.randn(n) if bias else None
    if dtype == "f32":
        return ops.LinearWeight(w, b)
    if dtype == "bf16":
        return ops.LinearWeight(w.bfloat16(), b)
    if dtype == "int8":
        return quantize_int8(ops.LinearWeight(w, b))
    return quantize_int4(ops.LinearWeight(w, b), int8_x=dtype == "int4q")


def dense(lw: ops.LinearWeight, k: int) -> torch.Tensor:
    """The float64 matrix a LinearWeight stands for."""
    if lw.weight.dtype == torch.uint8:
        return ops.int4_dequantize(lw, k).double()
    w = lw.weight.double()
    return w * lw.scale.double()[:, None] if lw.scale is not None else w


def reference(x: torch.Tensor, lw: ops.LinearWeight) -> torch.Tensor:
    """float64 product; x rounded to int8 first where the build multiplies int8 x."""
    if lw.int8_x and ops.int8_dot(kernels.library()):
        x = ops.quantize_x_int8(x)
    y = x.double() @ dense(lw, x.shape[-1]).T
    return y if lw.bias is None else y + lw.bias.double()


@pytest.fixture(params=list(kernels.BUILDS))
def kernels_on(request, monkeypatch):
    """Each build (AVX2 and AVX-512 reduce in different orders and tile differently, VNNI adds
    int8 x: each must be right and batch invariant on its own); one this CPU cannot run is its
    AVX2 emulation, which gives the same bits."""
    lib, why = kernels.load_build_or_emulation(request.param)
    if lib is None:
        pytest.skip(why)
    monkeypatch.setattr(kernels, "library", lambda: lib)
    yield
    ops.set_num_threads(max(1, torch.get_num_threads()))


# K: a multiple of every block, then not a multiple of 8, 16, 32 or 64; N: not a multiple of
# any register tile or work item
@pytest.mark.parametrize("k", [128, 100, 37, 5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_matches_float64(kernels_on, dtype, k):
    torch.manual_seed(0)
    lw = make_weight(dtype, 53, k)
    x = torch.randn(9, k)
    y = ops.linear(x, lw)
    assert y.dtype == torch.float32 and y.shape == (9, 53)
    torch.testing.assert_close(y.double(), reference(x, lw), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("k", [896, 192, 100, 37])
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_is_batch_invariant(kernels_on, dtype, k):
    """Row m of a 9-row product is bit-identical to the same row computed alone, inside a
    5-row slice (other tiles and k chunks), with one thread, and inside a 23-row product."""
    torch.manual_seed(1)
    lw = make_weight(dtype, 77, k)
    x = torch.randn(23, k)
    ops.set_num_threads(2)
    y9 = ops.linear(x[:9], lw)
    for m in range(9):
        assert torch.equal(ops.linear(x[m : m + 1], lw), y9[m : m + 1])
    for m0 in (0, 2, 4):
        assert torch.equal(ops.linear(x[m0 : m0 + 5], lw), y9[m0 : m0 + 5])
    assert torch.equal(ops.linear(x[:6], lw), y9[:6])  # the widest AVX-512 tile
    assert torch.equal(ops.linear(x, lw)[:9], y9)
    ops.set_num_threads(1)
    assert torch.equal(ops.linear(x[:9], lw), y9)


def test_int4_layout_and_torch_fallback(monkeypatch):
    """The int4 packing round-trips to the quantized values, and the plain-torch path (used
    when our kernels are off) computes the product, as the kernel does where it is in use."""
    torch.manual_seed(2)
    w = torch.randn(40, 100) * 0.05
    lw = quantize_int4(ops.LinearWeight(w, torch.randn(40)))
    assert lw.weight.dtype == torch.uint8 and lw.weight.shape == (40, 64)  # 100 -> 128 inputs
    assert lw.scale.dtype == torch.float16 and lw.scale.shape == (40, 4)
    deq = ops.int4_dequantize(lw, 100)
    scale = lw.scale.float().repeat_interleave(32, dim=1)[:, :100]
    assert ((deq - w).abs() <= scale.abs() / 2 + 1e-6).float().mean() > 0.99  # half a step
    q = deq / scale
    assert (q - q.round()).abs().max() < 1e-4 and q.min() >= -8 and q.max() <= 7
    x = torch.randn(3, 100)
    y = ops.linear(x, lw) if kernels.library() is not None else None
    monkeypatch.setattr(kernels, "library", lambda: None)
    y_torch = ops.linear(x, lw)
    torch.testing.assert_close(y_torch.double(), reference(x, lw), atol=1e-4, rtol=1e-4)
    if y is not None:
        torch.testing.assert_close(y_torch, y, atol=1e-4, rtol=1e-4)


def test_int8_x_is_what_the_vnni_build_multiplies(kernels_on):
    """With int8 x the result is the product of x's int8 rounding (not of x), within fp32
    rounding, and that rounding is coarse enough to see: the two references differ."""
    torch.manual_seed(3)
    lw = make_weight("int4q", 64, 300)
    x = torch.randn(4, 300)
    x[1, 7] = 40.0  # an outlier coarsens its 128-input block only
    y = ops.linear(x, lw)
    exact = x.double() @ dense(lw, 300).T + lw.bias.double()
    if not ops.int8_dot(kernels.library()):
        torch.testing.assert_close(y.double(), exact, atol=1e-4, rtol=1e-4)
        return
    xq = ops.quantize_x_int8(x)
    assert (xq - x.double()).abs().max() > 1e-3
    assert ((xq - x.double()).abs() <= xq.abs().amax() / 254 + 1e-6).all()  # half a step
    want = xq @ dense(lw, 300).T + lw.bias.double()
    torch.testing.assert_close(y.double(), want, atol=1e-4, rtol=1e-4)
    assert (y.double() - exact).abs().max() > 1e-3


def test_unknown_kernel_choice_is_an_error(monkeypatch):
    """A mistyped SPECDEC_KERNELS must not quietly fall back to the slow torch path."""
    monkeypatch.setenv("SPECDEC_KERNELS", "avx3")
    kernels._load.cache_clear()
    try:
        with pytest.raises(ValueError, match="SPECDEC_KERNELS='avx3'"):
            kernels.status()
    finally:
        monkeypatch.delenv("SPECDEC_KERNELS")
        kernels._load.cache_clear()
    assert kernels.status() == kernels._load()[1]


def test_every_build_this_cpu_runs_compiles():
    """A kernel source that fails to compile must fail here, not turn the kernel tests into
    skips (their fixtures skip a build that is unavailable)."""
    builds = kernels.supported_builds()
    if not builds:
        pytest.skip("this CPU runs none of our builds")
    for name in builds:
        lib, why = kernels.load_build(name)
        assert lib is not None, f"{name}: {why}"


def test_every_build_compiles_emulated_where_the_cpu_lacks_it():
    """On an AVX2-only CPU the AVX-512 builds are tested through SIMDe (set up by
    scripts/setup.sh): their emulation must build and say so, and must be refused for AVX2."""
    if kernels.supported_builds() != ["avx2"]:
        pytest.skip("this CPU runs the AVX-512 builds themselves (or none)")
    assert kernels.load_build("avx2", emulated=True)[0] is None
    for name in ("avx512", "avx512vnni"):
        lib, why = kernels.load_build_or_emulation(name)
        assert lib is not None, f"{name}: {why}"
        assert "emulated on AVX2" in why and lib.specdec_vector_lanes() == 16
        assert (getattr(lib, "linear_i4q", None) is not None) == (name == "avx512vnni")


def test_each_build_exports_only_its_c_api():
    """Two builds in one process (the every-build tests, ``ab_kernel_builds.py``) must not share
    code or data: GCC binds an inline variable (a GNU "unique" symbol) process-wide to its first
    definition even under RTLD_LOCAL, so an exported one would give a second build the first
    one's tile-pair layout."""
    import shutil
    import subprocess

    nm = shutil.which("nm")
    assert nm, "nm (binutils, installed with the compiler) is missing"
    built = 0
    for build in kernels.supported_builds():
        lib, why = kernels.load_build(build)
        assert lib is not None, why
        out = subprocess.run(
            [nm, "-D", "--defined-only", lib._name], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        syms = [line.split() for line in out.stdout.splitlines() if line.strip()]
        assert not [s for s in syms if s[1] == "u"], f"{build}: unique symbols exported"
        assert not [s for s in syms if "2gq" in s[-1]], f"{build}: kernel internals exported"
        assert "gguf_linear" in {s[-1] for s in syms}
        built += 1
    if not built:
        pytest.skip("no kernel build runs on this CPU")


@pytest.mark.parametrize("head_dim", [64, 128, 24])
def test_attention_bits_do_not_depend_on_the_pass(kernels_on, head_dim):
    """Our attention groups a pass's query tokens (16 at a time) and the heads that share a KV
    head, and walks the cache in blocks of 64 slots (32 for one query token with heads of 128),
    eight slots' dot products side by side. A query's output must still be the same bits
    whether it is decoded alone, inside a 20-token pass (two groups of tokens), next to another
    sequence, or under an explicit mask equal to the causal one (the masked path scores one
    slot at a time); and close to torch."""
    torch.manual_seed(3)
    n_heads, n_kv, ctx, new, slots = 6, 2, 150, 20, 192
    scale = head_dim**-0.5
    q = torch.randn(2, new, n_heads, head_dim)
    k = torch.randn(2, ctx + new, n_kv, head_dim)
    v = torch.randn(2, ctx + new, n_kv, head_dim)

    def cache():  # rows 0, 1 hold the two sequences' first ctx keys and values
        kc, vc = torch.zeros(2, n_kv, slots, head_dim), torch.zeros(2, n_kv, slots, head_dim)
        kc[:, :, :ctx] = k[:, :ctx].transpose(1, 2)
        vc[:, :, :ctx] = v[:, :ctx].transpose(1, 2)
        return kc, vc

    def run(b, t0, t1, mask=False, both=False):
        kc, vc = cache()
        bs = [0, 1] if both else [b]
        m = None
        if mask:
            m = torch.zeros(len(bs), t1 - t0, ctx + t1, dtype=torch.bool)
            for i in range(t1 - t0):
                m[:, i, : ctx + t0 + i + 1] = True
        if t0 > 0:  # the earlier new tokens enter the cache first, as a decode would leave them
            ops.attend(
                q[bs, :t0],
                k[bs, ctx : ctx + t0],
                v[bs, ctx : ctx + t0],
                kc,
                vc,
                torch.tensor(bs),
                torch.full((len(bs),), ctx),
                torch.full((len(bs),), t0),
                None,
                scale,
            )
        out = ops.attend(
            q[bs, t0:t1],
            k[bs, ctx + t0 : ctx + t1],
            v[bs, ctx + t0 : ctx + t1],
            kc,
            vc,
            torch.tensor(bs),
            torch.full((len(bs),), ctx + t0),
            torch.full((len(bs),), t1 - t0),
            m,
            scale,
        )
        return out[bs.index(b)]

    whole = run(1, 0, new)  # one 20-token pass
    for t in (0, 7, 16, 19):
        assert torch.equal(run(1, t, t + 1)[0], whole[t]), t  # decoded alone
    assert torch.equal(run(1, 0, new, both=True), whole)  # beside another sequence
    assert torch.equal(run(1, 0, new, mask=True), whole)  # the masked path
    kc, vc = cache()
    ref = ops._attend_torch(
        q[1:],
        k[1:, ctx:],
        v[1:, ctx:],
        kc[1:2].clone(),
        vc[1:2].clone(),
        torch.tensor([0]),
        torch.tensor([ctx]),
        torch.tensor([new]),
        None,
        scale,
    )
    torch.testing.assert_close(whole, ref[0], atol=1e-5, rtol=1e-5)
