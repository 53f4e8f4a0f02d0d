"""Draws from Python's ``random`` and NumPy's global generator inside a jitted program: every call
draws as eager does (the generators advance alike), a program that depends on a drawn number is
refused with its line, and so are draws of arrays, choices, shuffles and seeding. Draws from a
generator the program holds (a ``random.Random``, a NumPy ``Generator`` or ``RandomState``) are
refused naming it, the generator left as it was."""

import copy
import random

import numpy as np
import pytest
import torch
import torch.nn as nn

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


class LayerDrop(nn.Module):
    """Hugging Face's LayerDrop (MusicGen's decoder): a number is drawn for every layer, in
    training and in eval, and compared with ``layerdrop`` only in training."""

    def __init__(self, layerdrop: float, draw=lambda: random.uniform(0, 1)):
        super().__init__()
        self.layerdrop, self.draw = layerdrop, draw
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            dropout_probability = self.draw()
            if self.training and (dropout_probability < self.layerdrop):
                continue
            x = layer(x)
        return x


class AdapterLayerDrop(LayerDrop):
    """Wav2Vec2's adapter: ``np.random.random()`` compared only in training."""

    def forward(self, x):
        for layer in self.layers:
            layerdrop_prob = np.random.random()
            if not self.training or (layerdrop_prob > self.layerdrop):
                x = layer(x)
        return x


def _generator_states():
    return random.getstate(), np.random.get_state()[1].tobytes()


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)


def _x():
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("module_type", [LayerDrop, AdapterLayerDrop])
def test_layerdrop_that_never_drops_draws_as_eager_on_every_call(module_type, training):
    torch.manual_seed(0)
    eager = module_type(0.0 if module_type is LayerDrop else -1.0).train(training)
    model = copy.deepcopy(eager)
    jmodel = thunder_rs.jit(model)
    for seed in range(3):
        x, ex = _x(), _x()
        _seed(seed)
        out = jmodel(x)
        after = _generator_states()
        _seed(seed)
        expected = eager(ex)
        assert _generator_states() == after, "the compiled call must draw as many numbers as eager"
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(x.grad, ex.grad)
    assert thunder_rs.cache_misses(jmodel) == 1


def test_layerdrop_that_drops_is_refused_with_the_comparison_and_its_line():
    jmodel = thunder_rs.jit(LayerDrop(0.5).train())
    with pytest.raises(
        ThunderNotImplementedError,
        match=r"random\.uniform: the number it drew at .*test_python_random"
        r"\.py:\d+ is used \(compared with 0\.5\)",
    ):
        jmodel(_x())


def test_adapter_layerdrop_in_training_is_refused():
    # np.random.random() > 0.0 is False for a draw of exactly 0.0, so it depends on the number.
    jmodel = thunder_rs.jit(AdapterLayerDrop(0.0).train())
    with pytest.raises(ThunderNotImplementedError, match=r"numpy\.random\.random: .*\(compared with 0\.0\)"):
        jmodel(_x())


@pytest.mark.parametrize(
    "expression, decided",
    [
        (lambda: random.random() < 1.0, True),
        (lambda: random.random() >= 0, True),
        (lambda: random.random() == 1.0, False),
        (lambda: random.uniform(2, 3) > 3.5, False),
        (lambda: random.uniform(3, 2) <= 3, True),
        (lambda: random.randint(1, 6) != 7, True),
        (lambda: random.getrandbits(4) < 16, True),
        (lambda: np.random.uniform(-1, 1) > 1.5, False),
        (lambda: np.random.randint(0, 5) < 5, True),
        (lambda: random.random() < 0.5, None),
        (lambda: random.uniform(2, 3) >= 3, None),
        (lambda: random.gauss(0, 1) < 100.0, None),
        (lambda: np.random.randint(0, 5) <= 3, None),
    ],
)
def test_comparisons_of_a_drawn_number_run_only_when_every_number_gives_the_same_result(expression, decided):
    def program(x):
        return x + 1 if expression() else x - 1

    x = torch.randn(3)
    if decided is None:
        with pytest.raises(ThunderNotImplementedError, match="is used .compared with"):
            thunder_rs.jit(program)(x)
    else:
        torch.testing.assert_close(thunder_rs.jit(program)(x), x + 1 if decided else x - 1)


@pytest.mark.parametrize(
    "use, how",
    [
        (lambda x: x * random.random(), "as a float"),
        (lambda x: x[: random.randint(1, 3)], "as an index"),
        (lambda x: x + (random.random() + 1.0), "in arithmetic"),
        (lambda x: torch.full((2,), random.uniform(0, 1)) + x[:2], "as a float"),
        (lambda x: x if random.random() else -x, "as a truth value"),
        (lambda x: x.sum() * int(np.random.randint(3)), "as an int"),
    ],
)
def test_a_drawn_number_used_by_the_program_is_refused(use, how):
    with pytest.raises(ThunderNotImplementedError, match=f"the number it drew at .* is used \\({how}\\)"):
        thunder_rs.jit(use)(torch.randn(4))


@pytest.mark.parametrize(
    "draw, site, why",
    [
        (lambda: np.random.rand(1), "numpy.random.rand", "it returns a ndarray"),
        (lambda: np.random.choice(4), "numpy.random.choice", "only draws of one number"),
        (lambda: np.random.permutation(4), "numpy.random.permutation", "only draws of one number"),
        (lambda: random.choice([1, 2]), "random.choice", "only draws of one number"),
        (lambda: random.shuffle([1, 2, 3]), "random.shuffle", "only draws of one number"),
        (lambda: random.uniform(torch.tensor(0.0), 1), "random.uniform", "not plain numbers"),
    ],
)
def test_draws_that_cannot_be_repeated_are_refused_and_leave_the_generators_as_they_were(draw, site, why):
    def program(x):
        draw()
        return x + 1

    _seed(7)
    before = _generator_states()
    with pytest.raises(
        ThunderNotImplementedError,
        match=f"{site}: the program uses .* at .*test_python_random.py:\\d+ while it is traced \\(.*{why}",
    ):
        thunder_rs.jit(program)(torch.randn(2))
    assert _generator_states() == before


@pytest.mark.parametrize("kind", ["python", "numpy"])
def test_seeding_inside_a_program_is_made_by_every_call_as_eager(kind):
    # Tracing seeded once, and the generator reseeded between calls stayed so (then: refused).
    seed = random.seed if kind == "python" else np.random.seed
    draw = random.random if kind == "python" else np.random.random

    def seeds(x):
        seed(5)
        if random.uniform(0, 1) < 2.0:  # (a draw after it, of the seeded generator)
            x = x + 1
        return x

    seen = {}
    for name, fn in (("eager", seeds), ("jit", thunder_rs.jit(seeds))):
        seen[name] = []
        for reseed in (1, 2, 3):
            _seed(reseed)  # (between calls: eager's next call seeds again)
            torch.testing.assert_close(fn(torch.ones(2)), torch.full((2,), 2.0), rtol=0, atol=0)
            seen[name].append((draw(), random.random()))
    assert seen["jit"] == seen["eager"]


def test_seeding_the_wrappers_do_not_see_is_refused_and_reading_the_state_is_allowed():
    unwrapped = random._inst.seed  # as ``from random import seed`` before thunder_rs's first trace

    def seeds(x):
        unwrapped(0)
        return x + 1

    def saves_and_restores(x):
        state = random.getstate()
        random.setstate(state)
        return x + 1

    with pytest.raises(ThunderNotImplementedError, match="changed the state of Python's global random generator"):
        thunder_rs.jit(seeds)(torch.randn(2))
    torch.testing.assert_close(thunder_rs.jit(saves_and_restores)(torch.ones(2)), torch.full((2,), 2.0))


def test_a_draw_the_wrappers_do_not_see_is_refused():
    unwrapped = random._inst.random  # as ``from random import random`` before thunder_rs's first trace

    def program(x):
        unwrapped()
        return x + 1

    with pytest.raises(
        ThunderNotImplementedError, match="changed the state of Python's global random generator .* while it was traced"
    ):
        thunder_rs.jit(program)(torch.randn(2))


def test_eager_code_calls_the_generators_as_before():
    thunder_rs.jit(lambda x: x + random.random() * 0)  # a jit alone installs nothing
    thunder_rs.jit(LayerDrop(0.0).eval())(_x())  # the first trace puts the wrappers in
    _seed(3)
    drawn = (random.random(), random.uniform(1, 2), np.random.rand(2).tolist(), np.random.randint(0, 9))
    _seed(3)
    assert drawn == (
        random._inst.random(),
        random._inst.uniform(1, 2),
        np.random.mtrand._rand.rand(2).tolist(),
        np.random.mtrand._rand.randint(0, 9),
    )


def test_wav2vec2_spec_augment_in_training_is_refused_and_its_inference_matches_eager():
    transformers = pytest.importorskip("transformers")
    config = transformers.Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(8, 8),
        conv_stride=(4, 4),
        conv_kernel=(8, 4),
        num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2,
        num_labels=3,
        layerdrop=0.0,
        mask_time_prob=0.3,
        mask_time_length=2,
    )
    torch.manual_seed(0)
    model = transformers.Wav2Vec2ForSequenceClassification(config)
    values = torch.randn(2, 400, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ThunderNotImplementedError, match=r"numpy\.random\.rand: .*modeling_wav2vec2\.py:\d+"):
        thunder_rs.jit(model.train())(input_values=values)
    model.eval()
    torch.testing.assert_close(thunder_rs.jit(model)(input_values=values).logits, model(input_values=values).logits)


class HeldGenerator(nn.Module):
    """Augmentation drawing from a generator the model holds (``self.rng``, seeded per worker)."""

    def __init__(self, rng):
        super().__init__()
        self.rng = rng
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x * self.rng.uniform(0.5, 1.5))


HELD = {
    "random.Random": lambda: random.Random(0),
    "numpy.random.Generator": lambda: np.random.default_rng(0),
    "numpy.random.RandomState": lambda: np.random.RandomState(0),
}


@pytest.mark.parametrize("make", HELD.values(), ids=list(HELD))
def test_draws_from_a_generator_the_model_holds_are_refused_naming_it_and_leave_it_as_it_was(make):
    # They drew once while traced, and every compiled call reused that number: eager draws anew.
    model = HeldGenerator(make())
    unchanged = copy.deepcopy(model.rng)
    with pytest.raises(
        ThunderNotImplementedError,
        match=r"draws from the .*(Random|Generator|RandomState) HeldGenerator\.rng read at .*test_python_random.py:\d+",
    ):
        thunder_rs.jit(model)(_x())
    assert model.rng.uniform(0.5, 1.5) == unchanged.uniform(0.5, 1.5)


@pytest.mark.parametrize("passed", [False, True], ids=["closed over", "passed in"])
def test_draws_from_a_random_generator_closed_over_or_passed_in_are_refused(passed):
    rng = random.Random(3)

    def program(x, generator=None):
        return x * (generator or rng).random()

    args = (torch.ones(2), rng) if passed else (torch.ones(2),)
    where = "argument 'generator' read at the call" if passed else "closure variable 'rng' read at .*"
    with pytest.raises(ThunderNotImplementedError, match=f"draws from the random.Random {where}"):
        thunder_rs.jit(program)(*args)
    assert rng.random() == random.Random(3).random()


def test_a_generator_the_program_reads_but_does_not_draw_from_is_left_alone():
    rng = np.random.default_rng(0)

    def program(x):
        return x * 2 if rng is not None else x

    torch.testing.assert_close(thunder_rs.jit(program)(torch.ones(2)), torch.full((2,), 2.0))
    assert rng.random() == np.random.default_rng(0).random()
