"""The factorizations' backwards from their forward's outputs (``factorization_backwards``): eager's
derivative formulas on the decomposition the forward computed, not the factorization again under
torch.autograd. Gradients (and outputs) are compared with eager's bit for bit, for float32 and
float64, batched and non-contiguous inputs, and inputs where eager's formula divides by zero."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import thunder_rs


def _spd(a):
    return a @ a.mT + a.shape[-1] * torch.eye(a.shape[-1], dtype=a.dtype)


def _sym(a):
    return a + a.mT


def _well(a):
    return a + a.shape[-1] * torch.eye(a.shape[-1], dtype=a.dtype)


#: name -> (program, input maker)
OPS = {
    "eigh": (lambda a: torch.linalg.eigh(a), _sym),
    "eigh, upper": (lambda a: torch.linalg.eigh(a, UPLO="U")[1], _sym),
    "eigvalsh": (torch.linalg.eigvalsh, _sym),
    "svd": (lambda a: torch.linalg.svd(a), _well),
    "svd, tall": (lambda a: torch.linalg.svd(a[..., :3], full_matrices=False), _well),
    "svd, wide U": (lambda a: torch.linalg.svd(a[..., :3, :], full_matrices=False)[0], _well),
    "svdvals": (torch.linalg.svdvals, _well),
    "torch.svd": (lambda a: torch.svd(a[..., :3]), _well),
    "qr": (lambda a: torch.linalg.qr(a), _well),
    "qr, wide": (lambda a: torch.linalg.qr(a[..., :3, :]), _well),
    "qr, tall R": (lambda a: torch.linalg.qr(a[..., :3])[1], _well),
    "cholesky": (torch.linalg.cholesky, _spd),
    "cholesky, upper": (lambda a: torch.linalg.cholesky_ex(a, upper=True)[0], _spd),
    "inv": (torch.linalg.inv, _well),
    "inverse": (torch.inverse, _well),
    "det": (torch.linalg.det, _well),
    "slogdet": (lambda a: torch.linalg.slogdet(a)[1], _well),
    "solve": (lambda a: torch.linalg.solve(a, a[..., :2].exp()), _well),
    "solve, vector": (lambda a: torch.linalg.solve(a, a[..., 0].exp()), _well),
    "lu_factor": (lambda a: torch.linalg.lu_factor(a)[0], _well),
    "lu_factor_ex, wide": (lambda a: torch.linalg.lu_factor_ex(a[..., :3, :])[0], _well),
    "lu": (lambda a: torch.linalg.lu(a)[1:], _well),
    "lu, tall U": (lambda a: torch.linalg.lu(a[..., :3])[2], _well),
    "lu, wide L": (lambda a: torch.linalg.lu(a[..., :3, :])[1], _well),
    "solve, right": (lambda a: torch.linalg.solve(a, a[..., :2, :].exp(), left=False), _well),
    "slogdet, sign and log": (torch.linalg.slogdet, _well),
    "inv_ex": (lambda a: torch.linalg.inv_ex(a)[0], _well),
    "torch.svd, full": (lambda a: torch.svd(a, some=False), _well),
    "eig, values": (lambda a: torch.linalg.eig(a)[0], _well),
    "torch.svd, wide": (lambda a: torch.svd(a[..., :3, :]), _well),
    "matrix_exp": (torch.linalg.matrix_exp, _well),
    "Tensor.matrix_exp": (lambda a: (a / 4).matrix_exp(), _well),
    "eigvals": (torch.linalg.eigvals, _well),
    "pinv": (torch.linalg.pinv, _well),
    "pinv, tall": (lambda a: torch.linalg.pinv(a[..., :3]), _well),
    "pinv, wide, hermitian": (lambda a: torch.linalg.pinv(a + a.mT, hermitian=True), _well),
    "pinverse": (lambda a: torch.pinverse(a[..., :3, :]), _well),
    # (B a product with a number, whose node saves nothing: eager's exp would save B once more)
    "lstsq": (lambda a: torch.linalg.lstsq(a, a[..., :2] * 2).solution, _well),
    "lstsq, vector": (lambda a: torch.linalg.lstsq(a, a[..., 0] * 2).solution, _well),
    "lstsq, residuals": (lambda a: torch.linalg.lstsq(a[..., :3], a[..., 3:] * 2, driver="gels")[:2], _well),
    "solve_triangular": (lambda a: torch.linalg.solve_triangular(a, a[..., :2].exp(), upper=True), _well),
    "solve_triangular, right unit": (
        lambda a: torch.linalg.solve_triangular(a, a[..., :2, :].exp(), upper=False, left=False, unitriangular=True),
        _well,
    ),
}


def _nodes(events) -> set:
    """The autograd nodes a profile ran (``LinalgEighBackward0``) but the compiled call's own."""
    return {e.name for e in events if e.name.endswith("Backward0")}


def _outputs(out):
    return [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]


def _run(fn, a, seed: int = 1):
    """The outputs of ``fn(a)``, the gradient of ``a`` for random cotangents, and the autograd
    nodes the backward ran."""
    outs = _outputs(fn(a))
    gen = torch.Generator().manual_seed(seed)
    cots = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (grad,) = torch.autograd.grad(outs, a, cots)
    return outs, grad, _nodes(prof.events())


def _same(x, y) -> bool:
    return torch.equal(x.nan_to_num(), y.nan_to_num()) and torch.equal(x.isnan(), y.isnan())


def _input(make, shape, dtype, contiguous: bool):
    torch.manual_seed(0)
    a = make(torch.randn(shape, dtype=dtype))
    return (a if contiguous else a.mT.contiguous().mT).requires_grad_()


def _check(name, shape, dtype, contiguous):
    fn, make = OPS[name]
    a = _input(make, shape, dtype, contiguous)
    outs, grad, _ = _run(fn, a)
    jit_outs, jit_grad, jit_calls = _run(thunder_rs.jit(fn), a)
    assert all(torch.equal(x, y) for x, y in zip(outs, jit_outs))
    assert torch.equal(grad, jit_grad), (grad - jit_grad).abs().max()
    assert not jit_calls, f"the backward ran the factorization again under autograd: {jit_calls}"


@pytest.mark.parametrize("name", OPS)
def test_factorization_backwards_are_eagers_from_the_saved_outputs(name):
    _check(name, (3, 5, 5), torch.float64, contiguous=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5, 5), (2, 3, 5, 5)])
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "transposed"])
def test_factorization_backwards_are_eagers_everywhere(name, dtype, shape, contiguous):
    _check(name, shape, dtype, contiguous)


@pytest.mark.parametrize(
    "fn",
    [
        torch.linalg.det,
        torch.det,
        lambda a: torch.linalg.slogdet(a)[1],
        lambda a: a.slogdet()[1],
        lambda a: torch.linalg.solve(a, a[..., :2].exp()),
    ],
    ids=["linalg.det", "det", "linalg.slogdet", "Tensor.slogdet", "solve"],
)
def test_lu_backwards_read_the_forwards_lu_factors(fn):
    """det, slogdet and solve run eager's ``_linalg_det``/``_linalg_slogdet``/``_linalg_solve_ex``
    where an input requires grad, and the backward reads the LU factors they return (eager's
    node saves them): it factorizes nothing again."""
    a = _input(_well, (2, 4, 4), torch.float64, contiguous=True)
    jfn = thunder_rs.jit(fn)
    out = jfn(a)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (grad,) = torch.autograd.grad(out, a, torch.ones_like(out))
    names = {e.name for e in prof.events()}
    assert not {n for n in names if "lu_factor" in n or n.startswith(("aten::_linalg_", "aten::linalg_solve"))}, names
    assert torch.equal(grad, torch.autograd.grad(fn(a), a, torch.ones_like(out))[0])
    with torch.no_grad():  # (without grad, the op eager runs then: no factors returned)
        assert torch.equal(jfn(a), fn(a))


def test_solve_gradients_of_both_operands_are_eagers():
    torch.manual_seed(0)
    a = _well(torch.randn(2, 4, 4)).requires_grad_()
    b = torch.randn(4, 3, requires_grad=True)  # (broadcast over a's batch: its gradient is summed)
    cot = torch.randn(2, 4, 3)
    expected = torch.autograd.grad(torch.linalg.solve(a, b), (a, b), cot)
    got = torch.autograd.grad(thunder_rs.jit(torch.linalg.solve)(a, b), (a, b), cot)
    assert all(torch.equal(x, y) for x, y in zip(expected, got))


def test_repeated_eigenvalues_give_eagers_infinities():
    """eigh's gradient through the eigenvectors divides by the eigenvalues' gaps: eager's inf
    and NaN where two are equal, the same here."""
    a = torch.diag(torch.tensor([1.0, 1.0, 2.0], dtype=torch.float64)).requires_grad_()
    fn = lambda a: torch.linalg.eigh(a)[1]  # noqa: E731
    _, grad, _ = _run(fn, a)
    _, jit_grad, _ = _run(thunder_rs.jit(fn), a)
    assert not grad.isfinite().all()
    assert _same(grad, jit_grad)


def test_singular_determinant_gradient_is_eagers():
    """A singular matrix's zero pivot is perturbed by eps in det's backward, as eager's."""
    a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]], requires_grad=True)
    _, grad, _ = _run(torch.linalg.det, a)
    _, jit_grad, _ = _run(thunder_rs.jit(torch.linalg.det), a)
    assert torch.equal(grad, jit_grad)


@pytest.mark.parametrize("values", [[[[-1.5]], [[0.25]], [[3.0]]], [[[0.0]], [[2.0]]]], ids=["nonsingular", "singular"])
def test_determinant_of_1x1_matrices_has_eagers_gradient(values):
    """Eager's gradient of a 1x1 determinant is the cotangent itself (not its LU solve, an ulp
    off, or zero for a zero matrix)."""
    a = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    _, grad, _ = _run(torch.linalg.det, a)
    _, jit_grad, _ = _run(thunder_rs.jit(torch.linalg.det), a)
    assert torch.equal(grad, jit_grad)


def test_singular_inverse_raises_as_eager():
    a = torch.zeros(3, 3, requires_grad=True)
    with pytest.raises(RuntimeError) as expected:
        torch.linalg.inv(a)
    with pytest.raises(RuntimeError, match="singular") as got:
        thunder_rs.jit(torch.linalg.inv)(a)
    assert str(expected.value).split(":")[-1].strip() in str(got.value)


def test_complex_eigenvectors_of_a_phase_dependent_loss_raise_as_eager():
    """Complex inputs take the generic backward (torch's own, run again), which raises eager's
    error for a loss that depends on the eigenvectors' phases."""
    torch.manual_seed(0)
    a = torch.randn(3, 3, dtype=torch.complex128)
    a = (a + a.mH).requires_grad_()
    fn = lambda a: torch.linalg.eigh(a)[1].real.sum()  # noqa: E731
    with pytest.raises(RuntimeError, match="phi"):
        torch.autograd.grad(fn(a), a)
    with pytest.raises(RuntimeError, match="phi"):
        torch.autograd.grad(thunder_rs.jit(fn)(a), a)


@pytest.mark.parametrize("fn", [torch.linalg.householder_product, torch.orgqr], ids=["householder_product", "orgqr"])
@pytest.mark.parametrize("shapes", [((5, 5), (0,)), ((0, 0), (0,)), ((5, 4), (3,))], ids=["no tau", "empty", "3 of 4"])
def test_householder_product_without_reflectors_gives_no_gradient_as_eager(fn, shapes):
    """``householder_product_backward`` returns undefined gradients where there are no
    reflectors or no vectors: ``.grad`` stays None, not zeros."""
    torch.manual_seed(0)
    inputs = [torch.randn(shape, dtype=torch.float64, requires_grad=True) for shape in shapes]
    out = fn(*inputs)
    cot = torch.randn(out.shape, dtype=out.dtype)
    expected = torch.autograd.grad(out, inputs, cot, allow_unused=True)
    jit_out = thunder_rs.jit(fn)(*inputs)
    got = torch.autograd.grad(jit_out, inputs, cot, allow_unused=True)
    assert torch.equal(out, jit_out) and jit_out.requires_grad
    assert [g is None for g in got] == [g is None for g in expected]
    assert all(e is None or torch.equal(e, g) for e, g in zip(expected, got))


def test_formulas_run_without_tf32_and_restore_the_flag():
    """Eager's formulas run under ``NoTF32Guard``; the flag the program set is back afterwards."""
    matmul = torch.backends.cuda.matmul
    a = _input(_sym, (3, 4, 4), torch.float32, contiguous=True)
    fn = torch.linalg.eigh
    before = matmul.allow_tf32
    matmul.allow_tf32 = True
    try:
        _, grad, _ = _run(fn, a)
        _, jit_grad, _ = _run(thunder_rs.jit(fn), a)
        assert matmul.allow_tf32
    finally:
        matmul.allow_tf32 = before
    assert torch.equal(grad, jit_grad)


#: Programs whose compiled forward saves for backward what eager's node saves (``derivatives.yaml``:
#: the outputs alone where the formula needs no input).
SAVING = ["eigh", "eigvalsh", "svd", "svdvals", "qr", "qr, wide", "cholesky", "inv", "inverse", "det", "lu_factor"]
SAVING += ["lu", "lu, tall U", "slogdet", "slogdet, sign and log", "cholesky, upper", "inv_ex", "torch.svd"]
SAVING += [
    "torch.svd, full",
    "lu_factor_ex, wide",
    "eig, values",
    "eigvals",
    "pinv",
    "pinv, tall",
    "pinv, wide, hermitian",
]
SAVING += [
    "matrix_exp",
    "Tensor.matrix_exp",
    "torch.svd, wide",
    "pinverse",
    "lstsq",
    "lstsq, vector",
    "lstsq, residuals",
    "solve_triangular",
    "solve_triangular, right unit",
]


def _saved(fn, a) -> list:
    """The shapes and dtypes of the tensors ``fn(a)`` saves for backward, sorted."""
    packed = []

    def pack(t):
        packed.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(a)
    return sorted(packed, key=str)


@pytest.mark.parametrize("name", SAVING)
def test_the_forward_saves_what_eagers_node_saves(name):
    fn, make = OPS[name]
    a = _input(make, (2, 5, 5), torch.float64, contiguous=True)
    jfn = thunder_rs.jit(fn)
    jfn(a)
    assert _saved(jfn, a) == _saved(fn, a)


@pytest.mark.parametrize("mode, shape", [("r", (2, 3, 3)), ("complete", (4, 3))], ids=["r", "complete, tall"])
def test_qr_modes_eager_cannot_differentiate_raise_its_error(mode, shape):
    def fn(a):
        return torch.linalg.qr(a, mode=mode)[1]

    a = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError) as eager:
        torch.autograd.grad(fn(a).sum(), a)
    with pytest.raises(RuntimeError) as compiled:
        torch.autograd.grad(thunder_rs.jit(fn)(a).sum(), a)
    assert str(eager.value) in str(compiled.value)


def _hook_calls(fn, a) -> tuple:
    """What the pack and unpack hooks of ``saved_tensors_hooks`` see of ``fn(a)`` and its backward:
    each tensor's shape, dtype, device and strides, sorted."""
    packed, unpacked = [], []

    def seen(into):
        def hook(t):
            into.append((tuple(t.shape), t.dtype, t.device, t.stride()))
            return t

        return hook

    with torch.autograd.graph.saved_tensors_hooks(seen(packed), seen(unpacked)):
        outs = _outputs(fn(a))
        torch.autograd.grad(outs, a, [torch.ones_like(o) for o in outs])
    return sorted(packed, key=str), sorted(unpacked, key=str)


#: Programs with an opaque op whose metadata tracing draws from torch's meta kernel under autograd.
TRACED_ON_META = ["eigh", "det", "lu", "solve"]


@pytest.mark.parametrize("name", TRACED_ON_META)
def test_saved_tensors_hooks_see_eagers_tensors_on_the_first_call_too(name):
    """The first call traces the program, running meta stand-ins of the opaque ops under autograd:
    the user's hooks see none of them, only the compiled call's residuals, as eager's saved tensors."""
    fn, make = OPS[name]
    a = _input(make, (2, 4, 4), torch.float64, contiguous=True)
    jfn = thunder_rs.jit(fn)
    expected = _hook_calls(fn, a)
    assert _hook_calls(jfn, a) == expected
    assert _hook_calls(jfn, a) == expected


def test_saved_tensors_hooks_see_no_stand_in_of_a_generic_backward():
    """An opaque op with torch's backward run again (cholesky_inverse): the first call's hooks see
    what the later calls' see, no meta tensor."""
    a = _input(_spd, (2, 4, 4), torch.float64, contiguous=True)
    jfn = thunder_rs.jit(torch.cholesky_inverse)
    first = _hook_calls(jfn, a)
    assert first == _hook_calls(jfn, a)
    assert all(t[2] == a.device for t in first[0] + first[1])


def _records(fn, *inputs) -> tuple:
    """The outputs of ``fn(*inputs)``, the gradients of its inputs for random cotangents, and what
    the pack hook saw: each saved tensor's shape, dtype, device and strides, sorted, and their bytes."""
    packed = []

    def pack(t):
        packed.append((tuple(t.shape), t.dtype, t.device, t.stride()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outs = _outputs(fn(*inputs))
    gen = torch.Generator().manual_seed(1)
    cots = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
    grads = torch.autograd.grad(outs, [x for x in inputs if x.requires_grad], cots)
    nbytes = sum(torch.Size(t[0]).numel() * t[1].itemsize for t in packed)
    return outs, grads, sorted(packed, key=str), nbytes


def _check_records(fn, *inputs):
    outs, grads, saved, nbytes = _records(fn, *inputs)
    jfn = thunder_rs.jit(fn)
    for _ in range(2):  # (the first call, which traces, and a later one)
        jit_outs, jit_grads, jit_saved, jit_nbytes = _records(jfn, *inputs)
        assert all(torch.equal(x, y) for x, y in zip(outs, jit_outs))
        assert all(torch.equal(x, y) for x, y in zip(grads, jit_grads))
        assert (jit_saved, jit_nbytes) == (saved, nbytes)


@pytest.mark.parametrize("b_shape", [(2, 4, 3), (4, 3), (4,)], ids=["batched", "broadcast", "vector"])
@pytest.mark.parametrize("b_grad", [True, False], ids=["B requires grad", "B without grad"])
def test_solve_saves_As_factors_and_the_result_not_B(b_shape, b_grad):
    """Eager's node of ``linalg.solve`` saves A, its LU factors, pivots and the result, not B: B's
    gradient needs its shape alone."""
    torch.manual_seed(0)
    a = _well(torch.randn(2, 4, 4, dtype=torch.float64)).requires_grad_()
    b = torch.randn(b_shape, dtype=torch.float64, requires_grad=b_grad)
    _check_records(torch.linalg.solve, a, b)


def test_solve_of_one_matrix_as_both_operands_is_eagers():
    a = _input(_well, (3, 3), torch.float64, contiguous=True)
    _check_records(lambda a: torch.linalg.solve(a, a), a)


#: Programs of complex inputs whose formulas are eager's for complex inputs too.
COMPLEX_OPS = {
    "cholesky": (torch.linalg.cholesky, _spd),
    "cholesky_ex, upper": (lambda a: torch.linalg.cholesky_ex(a, upper=True)[0], _spd),
    "inv": (torch.linalg.inv, _well),
    "inv_ex": (lambda a: torch.linalg.inv_ex(a)[0], _well),
    "det": (torch.linalg.det, _well),
    "slogdet": (torch.linalg.slogdet, _well),
    "slogdet, log": (lambda a: torch.linalg.slogdet(a)[1], _well),
    "slogdet, sign": (lambda a: torch.linalg.slogdet(a)[0], _well),
    "solve": (lambda a: torch.linalg.solve(a, a[..., :2] * 2), _well),
    "solve, vector": (lambda a: torch.linalg.solve(a, a[..., 0] * 2), _well),
    # (losses that do not depend on the singular vectors' and eigenvectors' phases)
    "svd": (lambda a: _product(*torch.linalg.svd(a[..., :3], full_matrices=False)), _well),
    "svd, wide": (lambda a: _product(*torch.linalg.svd(a[..., :3, :], full_matrices=False)), _well),
    "qr": (torch.linalg.qr, _well),
    "qr, wide": (lambda a: torch.linalg.qr(a[..., :3, :]), _well),
    "pinv": (torch.linalg.pinv, _well),
    "pinv, wide": (lambda a: torch.linalg.pinv(a[..., :3, :]), _well),
    "lstsq": (lambda a: torch.linalg.lstsq(a, a[..., :2] * 2).solution, _well),
    "solve_triangular": (lambda a: torch.linalg.solve_triangular(a, a[..., :2] * 2, upper=True), _well),
    "matrix_exp": (lambda a: torch.linalg.matrix_exp(a * 0.25), _well),
    "eigvals": (torch.linalg.eigvals, _well),
    "lu": (lambda a: torch.linalg.lu(a)[1:], _well),
    "lu, tall": (lambda a: torch.linalg.lu(a[..., :3])[1:], _well),
    "lu, wide": (lambda a: torch.linalg.lu(a[..., :3, :])[1:], _well),
    "lu_factor": (lambda a: torch.linalg.lu_factor(a)[0], _well),
    "lu_factor_ex": (lambda a: torch.linalg.lu_factor_ex(a)[0], _well),
}


def _product(U, S, Vh):
    return (U * S.unsqueeze(-2)) @ Vh + U @ Vh


def _spd_complex(a):
    return a @ a.mH + a.shape[-1] * torch.eye(a.shape[-1], dtype=a.dtype)


@pytest.mark.parametrize("name", COMPLEX_OPS)
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "transposed"])
def test_complex_inputs_save_and_differentiate_as_eager(name, contiguous):
    fn, make = COMPLEX_OPS[name]
    make = _spd_complex if make is _spd else make
    _check_records(fn, _input(make, (2, 4, 4), torch.complex128, contiguous))


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPLEX_OPS)
@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 4, 4)])
def test_complex64_inputs_save_and_differentiate_as_eager(name, shape):
    fn, make = COMPLEX_OPS[name]
    make = _spd_complex if make is _spd else make
    _check_records(fn, _input(make, shape, torch.complex64, contiguous=False))


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: torch.linalg.svd(a)[0],
        lambda a: torch.svd(a)[2],
        lambda a: torch.linalg.eigh(a + a.mH)[1],
        lambda a: torch.linalg.eig(a)[1],
        lambda a: torch.linalg.eig(a.real)[1],
    ],
    ids=["linalg.svd", "torch.svd", "eigh", "eig", "eig, real"],
)
def test_complex_phase_dependent_losses_raise_eagers_error(fn):
    a = _input(_well, (2, 3, 3), torch.complex128, contiguous=True)
    cot = torch.randn(3, 3, dtype=torch.complex128, generator=torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match="phi") as eager:
        torch.autograd.grad(fn(a), a, cot.expand(2, 3, 3))
    with pytest.raises(RuntimeError, match="phi") as compiled:
        torch.autograd.grad(thunder_rs.jit(fn)(a), a, cot.expand(2, 3, 3))
    assert str(eager.value) in str(compiled.value)


def _hermitian(n: int, batch: tuple, seed: int):
    h = torch.randn(*batch, n, n, dtype=torch.complex128, generator=torch.Generator().manual_seed(seed))
    return h + h.mH


@pytest.mark.parametrize("name", ["torch.svd", "torch.svd, some=False", "eigh"])
def test_complex_singular_and_eigen_vectors_save_and_differentiate_as_eager(name):
    """The factorizations' outputs themselves, with cotangents on which the loss does not depend on
    the vectors' phases (``gU = U H``, ``gV = V H``, ``H`` Hermitian): what is saved, values and
    gradients are eager's."""
    a = _input(lambda a: _well(a + a.mH), (2, 4, 4), torch.complex128, contiguous=True)
    fn = {
        "torch.svd": lambda a: torch.svd(a[..., :3]),
        "torch.svd, some=False": lambda a: torch.svd(a, some=False),
        "eigh": torch.linalg.eigh,
    }[name]

    def run(f):
        packed = []

        def pack(t):
            packed.append((tuple(t.shape), t.dtype, t.device, t.stride()))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            outs = f(a)
        vectors = [o for o in outs if o.is_complex()]
        cots = [v.detach() @ _hermitian(v.shape[-1], v.shape[:-2], i) for i, v in enumerate(vectors)]
        return outs, torch.autograd.grad(vectors, a, cots), sorted(packed, key=str)

    outs, grads, saved = run(fn)
    jfn = thunder_rs.jit(fn)
    for _ in range(2):
        jit_outs, jit_grads, jit_saved = run(jfn)
        assert all(torch.equal(x, y) for x, y in zip(outs, jit_outs))
        assert torch.equal(grads[0], jit_grads[0])
        assert jit_saved == saved  # (torch.svd's node saves Vh = V^H, as LAPACK laid it out)


def test_solve_with_symbolic_sizes_reads_Bs_shape_at_each_call():
    """B's shape, passed to the backward in its place, holds the call's sizes where they are symbolic."""
    jfn = thunder_rs.jit(torch.linalg.solve, dynamic=True)
    for n, k in [(4, 3), (5, 2)]:
        torch.manual_seed(n)
        a = _well(torch.randn(2, n, n, dtype=torch.float64)).requires_grad_()
        b = torch.randn(n, k, dtype=torch.float64, requires_grad=True)
        outs, grads, saved, _ = _records(torch.linalg.solve, a, b)
        jit_outs, jit_grads, jit_saved, _ = _records(jfn, a, b)
        assert all(torch.equal(x, y) for x, y in zip((*outs, *grads), (*jit_outs, *jit_grads)))
        assert jit_saved == saved


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
def test_eigenpairs_save_and_differentiate_as_eager(dtype):
    """``linalg.eig``'s node saves the (complex) eigenvalues and eigenvectors, not the input; the
    backward is eager's formula on them (its real part for a real input), no eig computed again.
    (The eigenvectors' cotangent ``V diag(r)``, r real: a loss that does not depend on their phases.)"""
    a = _input(_well, (2, 4, 4), dtype, contiguous=False)

    def run(f):
        packed = []

        def pack(t):
            packed.append((tuple(t.shape), t.dtype, t.device, t.stride()))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            L, V = f(a)
        gen = torch.Generator().manual_seed(1)
        gL = torch.randn(L.shape, dtype=L.dtype, generator=gen)
        gV = V.detach() * torch.randn(V.shape[-1], dtype=torch.float64, generator=gen)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            (grad,) = torch.autograd.grad((L, V), a, (gL, gV))
        return (L, V), grad, sorted(packed, key=str), _nodes(prof.events())

    outs, grad, saved, _ = run(torch.linalg.eig)
    jfn = thunder_rs.jit(torch.linalg.eig)
    for _ in range(2):
        jit_outs, jit_grad, jit_saved, jit_calls = run(jfn)
        assert all(torch.equal(x, y) for x, y in zip(outs, jit_outs))
        assert torch.equal(grad, jit_grad)
        assert jit_saved == saved
        assert not jit_calls
