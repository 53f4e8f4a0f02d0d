"""What linear-algebra, FFT and attention calls save for backward, eager against jitted (first call
and later calls).

    python benchmarks/linalg_saved.py

Counts the tensors a ``saved_tensors_hooks`` pack hook sees during one forward call, their bytes,
and the bytes of their distinct storages (the memory held: eager packs a tensor once per node
that saves it, and views of one storage each), on 8 x 64 x 64 matrices and 2 x 4 x 128 x 32
attention inputs. Eager's autograd nodes save only what their formulas read; a compiled call
should save the same on its first call (the compile) and on every later one.
"""

import torch
import torch.nn.functional as F

import thunder_rs


def saved(fn, *args) -> tuple:
    """(count, bytes, bytes of distinct storages) of the tensors packed for backward while ``fn(*args)`` runs."""
    seen = [0, 0]
    storages: dict = {}

    def pack(t):
        seen[0] += 1
        seen[1] += t.numel() * t.element_size()
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return (*seen, sum(storages.values()))


def _well(dtype):
    return (torch.randn(8, 64, 64, dtype=dtype) + 64 * torch.eye(64)).requires_grad_()


def _spd(dtype):
    x = torch.randn(8, 64, 64, dtype=dtype)
    return (x @ x.mH + 64 * torch.eye(64)).requires_grad_()


def _linalg_cases():
    b = torch.randn(8, 64, 32, dtype=torch.float64, requires_grad=True)
    return [
        ("slogdet f64", torch.linalg.slogdet, _well(torch.float64)),
        ("cholesky_ex f64", lambda a: torch.linalg.cholesky_ex(a)[0], _spd(torch.float64)),
        ("inv_ex f64", lambda a: torch.linalg.inv_ex(a)[0], _well(torch.float64)),
        ("solve(A, B) f64", lambda a: torch.linalg.solve(a, b), _well(torch.float64)),
        ("torch.svd f64", torch.svd, _well(torch.float64)),
        ("inv c128", torch.linalg.inv, _well(torch.complex128)),
        ("slogdet c128", torch.linalg.slogdet, _well(torch.complex128)),
        ("qr c128", torch.linalg.qr, _well(torch.complex128)),
        ("eig f64", torch.linalg.eig, _well(torch.float64)),
        ("pinv f64", torch.linalg.pinv, _well(torch.float64)),
        ("lstsq f64", lambda a: torch.linalg.lstsq(a, b).solution, _well(torch.float64)),
        ("solve_triangular", lambda a: torch.linalg.solve_triangular(a, b, upper=True), _well(torch.float64)),
        ("matrix_exp f64", torch.linalg.matrix_exp, _well(torch.float64)),
        ("eig c128", torch.linalg.eigvals, _well(torch.complex128)),
        ("pinv c128", torch.linalg.pinv, _well(torch.complex128)),
        ("fft.rfft f64", torch.fft.rfft, _well(torch.float64)),
        ("fft.fftn c128", torch.fft.fftn, _well(torch.complex128)),
    ]


def _attention_cases():
    """CPU attention: the flash kernel's calls, and calls eager's math path takes (a value of another
    head size, a mask that requires grad), whose probabilities [B, H, L, S] its autograd keeps."""
    q, k, v = (torch.randn(2, 4, 128, 32, requires_grad=True) for _ in range(3))
    v48 = torch.randn(2, 4, 128, 48, requires_grad=True)
    bias = torch.randn(1, 4, 128, 128, requires_grad=True)
    return [
        ("sdpa causal", lambda q: F.scaled_dot_product_attention(q, k, v, is_causal=True), q),
        ("sdpa math, E!=Ev", lambda q: F.scaled_dot_product_attention(q, k, v48, is_causal=True), q),
        ("sdpa math, bias", lambda q: F.scaled_dot_product_attention(q, k, v, attn_mask=bias), q),
    ]


def main() -> None:
    torch.manual_seed(0)
    header = f"{'case':18s} {'eager':>24s} {'jit, first call':>24s} {'jit, later':>24s}"
    print(header + "   (count, bytes, bytes of distinct storages)")
    for name, fn, a in _linalg_cases() + _attention_cases():
        jitted = thunder_rs.jit(fn)
        first = saved(jitted, a)
        print(f"{name:18s} {str(saved(fn, a)):>24s} {str(first):>24s} {str(saved(jitted, a)):>24s}")


if __name__ == "__main__":
    main()
