"""``torch.vmap`` inside a jitted program over the ops of torch.func's tutorials (views, reductions,
joins, matmul/linear, convolution, pooling, batch_norm, layer_norm, group_norm, embedding, einsum,
scaled_dot_product_attention, dropout, cross_entropy): each batched call
against eager's vmap of the same function, values and gradients, over several in_dims/out_dims,
and model ensembling (``stack_module_state`` + ``functional_call``) of an MLP and a small CNN."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import thunder_rs

torch.manual_seed(0)


def same_as_eager(fn, *args, grads: bool = True):
    """``fn`` jitted against eager: the outputs, and where some argument requires grad the
    gradients of the outputs' sum of squares."""
    eager_args = [
        a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args
    ]
    expected = fn(*eager_args)
    actual = thunder_rs.jit(fn)(*args)
    torch.testing.assert_close(actual, expected)
    leaves = [(a, e) for a, e in zip(args, eager_args) if isinstance(a, torch.Tensor) and a.requires_grad]
    if grads and leaves:
        square = lambda out: sum((o.float() ** 2).sum() for o in torch.utils._pytree.tree_leaves(out))  # noqa: E731
        got = torch.autograd.grad(square(actual), [a for a, _ in leaves])
        want = torch.autograd.grad(square(expected), [e for _, e in leaves])
        torch.testing.assert_close(got, want)


def r(*shape, grad=True, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


#: (id, per-example function, in_dims, arguments): each is run as ``torch.vmap(fn, in_dims)``.
CASES = [
    ("view", lambda a: a.view(2, 6) * 2, 0, (r(3, 4, 3),)),
    # (an unbatched receiver: its rule read the receiver's levels, an AttributeError)
    ("expand_as-unbatched", lambda a, b: b.expand_as(a) * a, (0, None), (r(4, 2, 3), r(3))),
    ("reshape-minus-one", lambda a: a.reshape(-1, 2).sin(), 1, (r(4, 3, 3),)),
    ("flatten", lambda a: torch.flatten(a, 1), 0, (r(2, 3, 4, 5),)),
    ("flatten-0d", lambda a: a.flatten(), 0, (r(3),)),
    ("permute", lambda a: a.permute(2, 0, 1).cos(), 2, (r(2, 3, 4, 5),)),
    ("transpose", lambda a: a.transpose(0, -1) + 1, 0, (r(3, 4, 5),)),
    ("t", lambda a: a.t() * 3, 1, (r(4, 3, 2),)),
    ("unsqueeze-squeeze", lambda a: a.unsqueeze(-1).unsqueeze(0).squeeze(), 0, (r(3, 4),)),
    ("squeeze-dim", lambda a: a.squeeze(1) * 2, 0, (r(3, 4, 1),)),
    ("expand", lambda a: a.expand(2, 4, 3), 0, (r(5, 1, 3),)),
    ("T-mT", lambda a: a.T.sum(0) + a.mT.sum(0) + a.sum(0).T.sum(), 0, (r(3, 4, 5),)),
    ("movedim", lambda a: torch.movedim(a, 0, -1), 0, (r(2, 3, 4),)),
    ("getitem", lambda a: a[1:, ..., None, 0], 1, (r(3, 4, 5),)),
    ("select-narrow", lambda a: a.select(1, 2) + a.narrow(1, 0, 1).squeeze(1), 0, (r(3, 4, 3),)),
    ("chunk", lambda a: torch.stack(a.chunk(2, -1), 0), 0, (r(3, 4, 6),)),
    ("unbind", lambda a: sum(a.unbind(1)), 0, (r(3, 4, 2),)),
    ("sum-dim", lambda a: a.sum(-1, keepdim=True), 0, (r(3, 4, 5),)),
    ("sum-all", lambda a: a.sum(), 1, (r(4, 3, 2),)),
    ("sum-0d", lambda a: a.sum(), 0, (r(3),)),
    ("mean-dims", lambda a: a.mean((0, 2)), 0, (r(3, 4, 5, 2),)),
    ("amax", lambda a: a.amax(1), 0, (r(3, 4, 5),)),
    ("max-dim", lambda a: a.max(dim=1).values + a.max(1)[1], 0, (r(3, 4, 5),)),
    ("max-all", lambda a: a.max(), 0, (r(3, 4, 5),)),
    ("argmax-all", lambda a: a.argmax(), 0, (r(3, 4, 5, grad=False),)),
    ("max-of-two", lambda a, b: torch.max(a, b) + torch.min(b, a), (0, None), (r(3, 4), r(4))),
    ("norm", lambda a: a.norm() + a.norm(dim=1).sum() + torch.norm(a, 1) + a.norm(2, -1).sum(), 0, (r(3, 4, 5),)),
    ("std", lambda a: a.std(dim=1, correction=0), 0, (r(3, 4, 5),)),
    ("var-all", lambda a: torch.var(a), 0, (r(3, 4, 5),)),
    ("logsumexp", lambda a: torch.logsumexp(a, 1), 0, (r(3, 4, 5),)),
    ("softmax", lambda a: F.softmax(a, dim=-1), 0, (r(3, 4, 5),)),
    ("log_softmax", lambda a: torch.log_softmax(a, 0), 1, (r(4, 3, 5),)),
    ("cumsum", lambda a: a.cumsum(0), 0, (r(3, 4),)),
    ("cat", lambda a, b: torch.cat([a, b], 0), (0, None), (r(3, 4, 2), r(5, 2))),
    ("stack", lambda a, b: torch.stack([a, b], -1), (0, 1), (r(3, 4), r(4, 3))),
    ("matmul-mm", lambda a, b: a @ b, (0, None), (r(3, 4, 5), r(5, 2))),
    ("matmul-both", lambda a, b: torch.matmul(a, b), (0, 0), (r(3, 4, 5), r(3, 5, 2))),
    ("matmul-vec", lambda a, b: torch.matmul(a, b), (None, 0), (r(4, 5), r(3, 5))),
    ("matmul-vec-left", lambda a, b: a @ b, (0, None), (r(3, 5), r(2, 5, 4))),
    ("dot", lambda a, b: torch.dot(a, b), (0, 0), (r(3, 5), r(3, 5))),
    ("bmm", lambda a, b: torch.bmm(a, b), (1, None), (r(2, 3, 4, 5), r(2, 5, 2))),
    ("linear-batched-weight", lambda x, w, b: F.linear(x, w, b), (None, 0, 0), (r(6, 4), r(3, 5, 4), r(3, 5))),
    ("linear-batched-input", lambda x, w: F.linear(x, w), (0, None), (r(3, 6, 4), r(5, 4))),
    ("relu-gelu", lambda a: F.gelu(F.relu(a) - 0.5), 0, (r(3, 4),)),
    (
        "conv2d-batched-input",
        lambda x, w, b: F.conv2d(x, w, b, padding=1),
        (0, None, None),
        (r(3, 2, 2, 6, 6), r(4, 2, 3, 3), r(4)),
    ),
    (
        "conv2d-batched-weight",
        lambda x, w, b: F.conv2d(x, w, b, stride=2),
        (None, 0, 0),
        (r(2, 2, 7, 7), r(3, 4, 2, 3, 3), r(3, 4)),
    ),
    ("conv2d-groups", lambda x, w: F.conv2d(x, w, groups=2), (0, 0), (r(3, 2, 4, 5, 5), r(3, 6, 2, 3, 3))),
    ("conv1d-unbatched-example", lambda x, w: F.conv1d(x, w), (0, 0), (r(3, 2, 7), r(3, 4, 2, 3))),
    ("max_pool2d", lambda x: F.max_pool2d(x, 2), 0, (r(3, 2, 4, 6, 6),)),
    ("max_pool2d-indices", lambda x: F.max_pool2d(x, 3, 2, return_indices=True)[1], 1, (r(2, 3, 7, 7, grad=False),)),
    ("avg_pool1d", lambda x: F.avg_pool1d(x, 2), 0, (r(3, 4, 8),)),
    ("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, 1), 0, (r(3, 2, 4, 5, 5),)),
    (
        "batch_norm-eval",
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
        (0, 0, 0, 0, 0),
        (r(3, 2, 4, 5, 5), r(3, 4, grad=False), torch.rand(3, 4) + 0.5, r(3, 4), r(3, 4)),
    ),
    (
        "batch_norm-eval-unbatched-stats",
        lambda x, m, v: F.batch_norm(x, m, v, training=False),
        (0, None, None),
        (r(3, 2, 4, 5), r(4, grad=False), torch.rand(4) + 0.5),
    ),
    ("batch_norm-no-running-stats", lambda x: F.batch_norm(x, None, None, training=True), 0, (r(3, 5, 4, 2),)),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (5,), w, b), (0, None, None), (r(3, 4, 5), r(5), r(5))),
    (
        "layer_norm-batched-affine",
        lambda x, w, b: F.layer_norm(x, (4, 5), w, b),
        (None, 0, 0),
        (r(2, 4, 5), r(3, 4, 5), r(3, 4, 5)),
    ),
    ("layer_norm-no-affine", lambda x: F.layer_norm(x, (5,)), 1, (r(4, 3, 5),)),
    ("dropout-eval", lambda x: F.dropout(x, 0.3, training=False) * 2, 0, (r(3, 4),)),
    ("cross_entropy-mean", lambda x, y: F.cross_entropy(x, y), (0, 0), (r(3, 4, 5), torch.randint(0, 5, (3, 4)))),
    ("cross_entropy-one-example", lambda x, y: F.cross_entropy(x, y), (0, 0), (r(3, 5), torch.randint(0, 5, (3,)))),
    (
        "cross_entropy-ignored-weighted",
        lambda x, y, w: F.cross_entropy(x, y, w, ignore_index=1),
        (0, 0, None),
        (r(3, 6, 4), torch.randint(0, 4, (3, 6)), torch.rand(4) + 0.1),
    ),
    (
        "cross_entropy-smoothed-ignored",
        lambda x, y: F.cross_entropy(x, y, ignore_index=2, label_smoothing=0.1),
        (0, 0),
        (r(3, 6, 4), torch.randint(0, 4, (3, 6))),
    ),
    (
        "cross_entropy-smoothed-weighted-sum",
        lambda x, y, w: F.cross_entropy(x, y, w, reduction="sum", label_smoothing=0.2),
        (0, 0, None),
        (r(3, 6, 4), torch.randint(0, 4, (3, 6)), torch.rand(4) + 0.1),
    ),
    ("embedding", lambda i, w: F.embedding(i, w), (0, None), (torch.randint(0, 6, (3, 4)), r(6, 5))),
    (
        "embedding-padding-idx",
        lambda i, w: F.embedding(i, w, padding_idx=0),
        (1, None),
        (torch.randint(0, 6, (2, 3, 4)), r(6, 5)),
    ),
    ("embedding-batched-table", lambda i, w: F.embedding(i, w), (0, 0), (torch.randint(0, 6, (3, 2, 4)), r(3, 6, 5))),
    ("embedding-shared-indices", lambda i, w: F.embedding(i, w), (None, 0), (torch.randint(0, 6, (4,)), r(3, 6, 5))),
    ("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), (0, None, None), (r(3, 2, 4, 5), r(4), r(4))),
    (
        "group_norm-batched-affine",
        lambda x, w, b: F.group_norm(x, 2, w, b),
        (None, 0, 0),
        (r(2, 4, 5), r(3, 4), r(3, 4)),
    ),
    (
        "group_norm-batched-affine-dim-1",  # (eager normalises the unbatched input once: its layout)
        lambda x, w, b: F.group_norm(x, 2, w, b),
        (None, 1, 1),
        (r(2, 4, 5), r(4, 3), r(4, 3)),
    ),
    ("group_norm-no-affine", lambda x: F.group_norm(x, 3), 1, (r(2, 3, 6, 4),)),
    ("einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), (0, None), (r(3, 4, 5), r(5, 2))),
    ("einsum-implicit", lambda a, b: torch.einsum("bij,bjk", a, b), (0, 0), (r(3, 2, 4, 5), r(3, 2, 5, 2))),
    ("einsum-ellipsis-list", lambda a, b: torch.einsum("...i,i->...", [a, b]), (1, 0), (r(4, 3, 5), r(3, 5))),
    ("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), 0, (r(3, 2, 4, 8), r(3, 2, 5, 8), r(3, 2, 5, 8))),
    (
        "sdpa-mapped-dim-1",  # (eager on the CPU: one call per example, stacked contiguous)
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        1,
        (r(2, 3, 4, 8), r(2, 3, 5, 8), r(2, 3, 5, 8)),
    ),
    (
        "sdpa-causal-shared-keys",
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (0, None, None),
        (r(3, 2, 2, 4, 8), r(2, 2, 4, 8), r(2, 2, 4, 8)),
    ),
    (
        "sdpa-batched-mask",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        0,
        (r(3, 2, 4, 8), r(3, 2, 5, 8), r(3, 2, 5, 8), torch.randn(3, 4, 5)),
    ),
    (
        "sdpa-shared-bool-mask",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        (0, 0, 0, None),
        (r(3, 2, 4, 8), r(3, 2, 5, 8), r(3, 2, 5, 8), torch.rand(4, 5) > 0.3),
    ),
    (
        "nll_loss-sum",
        lambda x, y: F.nll_loss(x, y, reduction="sum"),
        (0, None),
        (r(3, 4, 5), torch.randint(0, 5, (4,))),
    ),
    (
        "nll_loss-none-2d",
        lambda x, y: F.nll_loss(x, y, reduction="none"),
        (0, 0),
        (r(3, 2, 4, 5), torch.randint(0, 4, (3, 2, 5))),
    ),
]


@pytest.mark.parametrize("fn, in_dims, args", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_batched_ops_match_eagers_vmap(fn, in_dims, args):
    same_as_eager(lambda *xs: torch.vmap(fn, in_dims=in_dims)(*xs), *args)


def _strides(out) -> list:
    return [t.stride() for t in torch.utils._pytree.tree_leaves(out)]


#: Cases whose strides differ from eager's for a reason outside the batching rules (none since a
#: view returned of an input is taken again by the torch op the program called: ``x[..., None, 0]``).
STRIDES_DIFFER: dict[str, str] = {}


@pytest.mark.parametrize(
    "fn, in_dims, args",
    [
        pytest.param(*c[1:], id=c[0], marks=[pytest.mark.xfail(strict=True, reason=STRIDES_DIFFER[c[0]])])
        if c[0] in STRIDES_DIFFER
        else pytest.param(*c[1:], id=c[0])
        for c in CASES
    ],
)
def test_batched_ops_have_eagers_strides(fn, in_dims, args):
    # A later view() or stride-dependent code of the caller sees eager's layout: where eager's rule
    # keeps the level where its operand holds it (an unbatched matrix times batched vectors puts it
    # last; embedding keeps the indices' in_dim, a batched table's levels follow the indices) too.
    batched = torch.vmap(fn, in_dims=in_dims)
    assert _strides(thunder_rs.jit(batched)(*args)) == _strides(batched(*args))


def test_nested_vmaps_keep_eagers_layouts_of_mapped_indices_and_vectors():
    def f(i, w, m, v, table):
        looked_up = torch.vmap(torch.vmap(lambda i, w: F.embedding(i.long(), w), in_dims=(1, None)), in_dims=(1, None))
        shared = torch.vmap(lambda w: F.embedding(torch.tensor([1, 0, 3, 1]), w, padding_idx=1))
        products = torch.vmap(torch.vmap(torch.mv, in_dims=(None, 0)), in_dims=(None, 1))
        return looked_up(i, w), shared(table), products(m, v)

    args = (torch.randint(0, 6, (2, 3, 4), dtype=torch.int32), r(6, 5), r(4, 5), r(3, 2, 5), r(3, 6, 5))
    same_as_eager(f, *args)
    assert _strides(thunder_rs.jit(f)(*args)) == _strides(f(*args))


@pytest.mark.parametrize("out_dims", [0, 1, -1])
def test_nested_vmaps_with_out_dims_match_eager(out_dims):
    def f(x, w):
        inner = torch.vmap(lambda row, w: F.softmax(row @ w, -1).sum(0), in_dims=(0, None), out_dims=0)
        return torch.vmap(inner, in_dims=(1, 0), out_dims=out_dims)(x, w)

    same_as_eager(f, r(4, 3, 5, 2), r(3, 2, 6))


def test_nested_vmaps_of_einsum_embedding_and_group_norm_match_eager():
    def f(a, b, i, w, x, gw):
        def inner(a, b, i, w, x, gw):
            return torch.einsum("ij,jk", a, b).mean() + F.embedding(i, w).mean() * F.group_norm(x, 2, gw).mean()

        inner = torch.vmap(inner, in_dims=(0, None, 0, 0, None, 0))
        return torch.vmap(inner, in_dims=(1, 0, None, 0, 0, None))(a, b, i, w, x, gw)

    same_as_eager(f, r(2, 3, 4, 5), r(3, 5, 6), torch.randint(0, 6, (2, 4)), r(3, 2, 6, 5), r(3, 2, 4, 3), r(2, 4))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.drop = nn.Linear(8, 16), nn.Linear(16, 4), nn.Dropout(0.1)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.fc1(x))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(torch.flatten(x, 1))


def trained_statistics(model):
    """Running statistics other than the initial zeros and ones, so that eval's batch_norm uses them."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def ensemble(models, x_dim=None, out_dims=0):
    base = copy.deepcopy(models[0]).to("meta")

    def run(params, buffers, x):
        call = lambda p, b, x: torch.func.functional_call(base, (p, b), (x,))  # noqa: E731
        return torch.vmap(call, in_dims=(0, 0, x_dim), out_dims=out_dims)(params, buffers, x)

    return run


@pytest.mark.parametrize("model, shape", [(MLP, (6, 8)), (CNN, (6, 1, 8, 8))], ids=["mlp", "cnn"])
def test_model_ensembling_matches_eager(model, shape):
    models = [trained_statistics(model()) for _ in range(3)]
    params, buffers = torch.func.stack_module_state(models)
    assert all(p.requires_grad for p in params.values())
    same_as_eager(ensemble(models), params, buffers, torch.randn(shape))
    assert thunder_rs.examine(ensemble(models), params, buffers, torch.randn(shape)).fallbacks == {}
    # The same data for every model (in_dims 0 on a stacked minibatch) and a fresh compile's
    # reuse of the trace for new values.
    jitted = thunder_rs.jit(ensemble(models))
    for _ in range(2):
        x = torch.randn(shape)
        torch.testing.assert_close(jitted(params, buffers, x), ensemble(models)(params, buffers, x))


@pytest.mark.parametrize("model, shape", [(MLP, (6, 8)), (CNN, (6, 1, 8, 8))], ids=["mlp", "cnn"])
def test_model_ensembling_over_a_minibatch_per_model_with_out_dims_matches_eager(model, shape):
    # in_dims 0 for the data too: each model sees its own minibatch; the ensemble dim put last.
    models = [trained_statistics(model()) for _ in range(3)]
    params, buffers = torch.func.stack_module_state(models)
    same_as_eager(ensemble(models, x_dim=1, out_dims=-1), params, buffers, torch.randn(shape[0], 3, *shape[1:]))


def test_dropout_in_training_under_vmap_raises_as_eager():
    def f(x):
        return torch.vmap(lambda a: F.dropout(a, 0.5, training=True))(x)

    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="randomness error mode"):
        f(x)
    with pytest.raises(RuntimeError, match=r"randomness error mode \(dropout at .*test_vmap_rules\.py"):
        thunder_rs.jit(f)(x)
    with pytest.raises(NotImplementedError, match="randomness='different'"):
        thunder_rs.jit(lambda x: torch.vmap(lambda a: F.dropout(a, 0.5), randomness="different")(x))(x)


@pytest.mark.parametrize("draw", ["randn", "dropout-of-unbatched"])
def test_draws_under_vmap_follow_its_randomness_as_eager(draw):
    w = torch.randn(4)
    body = (lambda a: a + torch.randn(4)) if draw == "randn" else (lambda a: a * F.dropout(w, 0.5))
    x = torch.randn(3, 4)
    error, same, different = (lambda x, m=m: torch.vmap(body, randomness=m)(x) for m in ("error", "same", "different"))
    with pytest.raises(RuntimeError, match="randomness error mode"):
        error(x)
    with pytest.raises(RuntimeError, match=r"randomness error mode.*test_vmap_rules\.py"):
        thunder_rs.jit(error)(x)
    torch.manual_seed(7)
    expected = same(x)
    torch.manual_seed(7)
    torch.testing.assert_close(thunder_rs.jit(same)(x), expected)  # one draw for every example
    different(x)  # eager draws per example
    with pytest.raises(NotImplementedError, match="randomness='different'"):
        thunder_rs.jit(different)(x)


def test_dropout_that_draws_nothing_is_allowed_under_vmap_as_in_eager():
    w = torch.randn(4)

    def f(x):
        return torch.vmap(lambda a: F.dropout(a, 0.0) + F.dropout(w, 0.5, training=False))(x)

    same_as_eager(f, r(3, 4))


def test_batch_norm_updating_running_statistics_not_batched_raises_eagers_error_with_the_line():
    # (running statistics the vmap maps are updated as eager's: tests/test_ensembles.py)
    m, v = torch.zeros(4), torch.ones(4)

    def f(x):
        return torch.vmap(lambda a: F.batch_norm(a, m, v, training=True))(x)

    with pytest.raises(RuntimeError, match="were not batched"):
        f(torch.randn(3, 2, 4))
    with pytest.raises(RuntimeError, match=r"(?s)were not batched.*test_vmap_rules\.py:\d+"):
        thunder_rs.jit(f)(torch.randn(3, 2, 4))


def test_an_op_without_a_rule_is_still_refused_with_the_line():
    def f(x):
        return torch.vmap(lambda a: torch.sort(a).values)(x)

    with pytest.raises(NotImplementedError, match=r"sort has no thunder_rs batching rule.*test_vmap_rules\.py:\d+"):
        thunder_rs.jit(f)(torch.randn(3, 4))


def test_what_eagers_vmap_refuses_is_refused():
    # eager's mean of a label-smoothed, class-weighted cross_entropy selects by a batched mask
    def f(x, y, w):
        return torch.vmap(lambda a, b: F.cross_entropy(a, b, w, label_smoothing=0.1))(x, y)

    x, y, w = torch.randn(3, 6, 4), torch.randint(0, 4, (3, 6)), torch.rand(4)
    with pytest.raises(RuntimeError, match="masked_select"):
        f(x, y, w)
    with pytest.raises(NotImplementedError, match=r"cross_entropy has no thunder_rs batching rule.*label_smoothing"):
        thunder_rs.jit(f)(x, y, w)


# -- on CUDA ---------------------------------------------------------------------------------------

#: The cases the default run checks on fake CUDA tensors (the others are slow): one per family of
#: rules whose CUDA path differs (attention's kernel choice, gathers, normalisations, products).
QUICK_ON_CUDA = {
    "sdpa",
    "sdpa-batched-mask",
    "embedding-batched-table",
    "group_norm",
    "einsum-implicit",
    "conv2d-groups",
    "matmul-vec",  # (the level last, as functorch's mv rule leaves it)
    "embedding-shared-indices",
}


def _cuda_cases(quick: set | None):
    return [
        pytest.param(*c[1:], id=c[0], marks=() if quick is None or c[0] in quick else pytest.mark.slow) for c in CASES
    ]


def _to_cuda(args, dtype):
    return [
        a.detach().to("cuda", dtype if a.is_floating_point() else a.dtype).requires_grad_(a.requires_grad)
        if isinstance(a, torch.Tensor)
        else a
        for a in args
    ]


def _metadata(out, strides: bool = True) -> list:
    leaves = torch.utils._pytree.tree_leaves(out)
    return [(t.shape, t.stride() if strides else None, t.dtype, t.device, t.requires_grad) for t in leaves]


def _compiled_node(outputs: list):
    """The compiled call's backward node the outputs reach (through the views eager takes of its
    outputs after it); None where they are views of the inputs, which no compiled call computes."""
    nodes = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while nodes:
        node = nodes.pop(0)
        if hasattr(node, "apply"):
            return node
        nodes.extend(n for n, _ in node.next_functions if n is not None)
    return None


@pytest.mark.parametrize("fn, in_dims, args", _cuda_cases(QUICK_ON_CUDA))
def test_batched_ops_on_fake_cuda_tensors_in_bfloat16_have_eagers_metadata(fn, in_dims, args, fake_ex):
    """Each rule on fake CUDA tensors in bfloat16 with the CUDA default executors (the stand-in
    nvFuser, which claims CUDA tensors only, and torch): the outputs' shapes, strides, dtypes,
    devices and requires_grad are eager's vmap's, and the compiled backward gives each input a gradient of its
    own shape and dtype (called directly: the autograd engine wants a GPU)."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415
    from thunder_rs.executors.nvfuser_ex import NvFuserExecutor  # noqa: PLC0415

    cuda_ex = NvFuserExecutor("nvfuser_fake_cuda", module=fake_ex.module)
    batched = torch.vmap(fn, in_dims=in_dims)
    with FakeTensorMode(allow_non_fake_inputs=True):
        inputs = _to_cuda(args, torch.bfloat16)
        expected = batched(*inputs)
        actual = thunder_rs.jit(batched, executors=[cuda_ex, "torch"])(*inputs)
        strides = all(fn is not c[1] for c in CASES if c[0] in STRIDES_DIFFER)
        assert _metadata(actual, strides) == _metadata(expected, strides)
        node = _compiled_node([t for t in torch.utils._pytree.tree_leaves(actual) if t.requires_grad])
        if node is None:
            return
        cotangents = [torch.ones(m.shape, dtype=m.dtype, device=m.device) for m in node._input_metadata]
        with torch.no_grad():
            grads = node.apply(*cotangents)
    leaves = {(t.shape, t.dtype) for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad}
    assert {(g.shape, g.dtype) for g in grads if isinstance(g, torch.Tensor)} <= leaves


@pytest.mark.gpu
@pytest.mark.parametrize("fn, in_dims, args", _cuda_cases(None))
def test_batched_ops_on_cuda_match_eagers_vmap(fn, in_dims, args):
    """Every rule on CUDA with the default executors (nvFuser among them where it imports; torch's
    attention kernels chosen for the folded batch): values and gradients against eager's vmap."""
    same_as_eager(lambda *xs: torch.vmap(fn, in_dims=in_dims)(*xs), *_to_cuda(args, torch.float32))
