"""What linear-algebra calls save for backward, eager against jitted (first call and later calls).

    python benchmarks/linalg_saved.py

Counts the tensors a ``saved_tensors_hooks`` pack hook sees during one forward call, and their
bytes, on 8 x 64 x 64 inputs. Eager's autograd nodes save only what their formulas read; a
compiled call should save the same on its first call (the compile) and on every later one.
"""

import torch

import thunder_rs


def saved(fn, *args) -> tuple:
    """(count, bytes) of the tensors packed for backward while ``fn(*args)`` runs."""
    seen = [0, 0]

    def pack(t):
        seen[0] += 1
        seen[1] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return tuple(seen)


def _well(dtype):
    return (torch.randn(8, 64, 64, dtype=dtype) + 64 * torch.eye(64)).requires_grad_()


def _spd(dtype):
    x = torch.randn(8, 64, 64, dtype=dtype)
    return (x @ x.mH + 64 * torch.eye(64)).requires_grad_()


def main() -> None:
    torch.manual_seed(0)
    b = torch.randn(8, 64, 32, dtype=torch.float64, requires_grad=True)
    cases = [
        ("slogdet f64", torch.linalg.slogdet, _well(torch.float64)),
        ("cholesky_ex f64", lambda a: torch.linalg.cholesky_ex(a)[0], _spd(torch.float64)),
        ("inv_ex f64", lambda a: torch.linalg.inv_ex(a)[0], _well(torch.float64)),
        ("solve(A, B) f64", lambda a: torch.linalg.solve(a, b), _well(torch.float64)),
        ("torch.svd f64", torch.svd, _well(torch.float64)),
        ("inv c128", torch.linalg.inv, _well(torch.complex128)),
        ("slogdet c128", torch.linalg.slogdet, _well(torch.complex128)),
        ("qr c128", torch.linalg.qr, _well(torch.complex128)),
    ]
    print(f"{'case':16s} {'eager':>18s} {'jit, first call':>18s} {'jit, later':>18s}   (count, bytes)")
    for name, fn, a in cases:
        jitted = thunder_rs.jit(fn)
        first = saved(jitted, a)
        print(f"{name:16s} {str(saved(fn, a)):>18s} {str(first):>18s} {str(saved(jitted, a)):>18s}")


if __name__ == "__main__":
    main()
