"""torchvision detection models trained under ``thunder_rs.jit`` next to an eager copy: the
samplers draw random numbers (``torch.randperm`` in ``BalancedPositiveNegativeSampler``), box
counts come from ``nms`` and score thresholds, the matcher reads its quality matrix's maxima.
Losses, every gradient and the parameters after an SGD step equal eager's, and the compiles stay
bounded."""

import copy
import re
import time

import pytest
import torch

import thunder_rs
from thunder_rs.core.base.userframe import is_user_file
from twin_training import misses

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = dict(rtol=1e-4, atol=1e-5)


def _targets(g: torch.Generator, count: int, size: int) -> list[dict]:
    """``count`` targets of 1 to 3 random boxes inside a ``size`` square image, labels 1 or 2."""
    targets = []
    for _ in range(count):
        n = int(torch.randint(1, 4, (), generator=g))
        xy = torch.rand(n, 2, generator=g) * (size * 0.6)
        wh = torch.rand(n, 2, generator=g) * (size * 0.35) + 8
        boxes = torch.cat([xy, (xy + wh).clamp(max=size - 1)], dim=1)
        labels = torch.randint(1, 3, (n,), generator=g, dtype=torch.int64)
        targets.append(dict(boxes=boxes, labels=labels))
    return targets


def train_detection_like_eager(model, steps: int, images: int = 2, size: int = 160):
    """Trains ``model`` (in train mode, returning a loss dict) jitted and an eager copy of it for
    ``steps`` SGD steps on random images and boxes, seeding the random state alike before each
    call; losses, gradients and parameters after each step equal eager's. Returns the jitted
    module.

    Each step starts from eager's parameters: the losses are not smooth in them (box coordinates
    choose ``roi_align``'s sampling points and the IoU thresholds' matches), so the last bits in
    which a compiled sum differs from eager's grow, over a step, to 1e-4 in the first conv's
    gradient (eager itself, given gradients 1e-6 apart, differs by 2e-3 a step later)."""
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        batch = [torch.rand(3, size, size, generator=g) for _ in range(images)]
        targets = _targets(g, images, size)
        torch.manual_seed(step)
        losses = jmodel(batch, copy.deepcopy(targets))
        torch.manual_seed(step)
        expected = eager(batch, copy.deepcopy(targets))
        assert losses.keys() == expected.keys()
        for key in expected:
            torch.testing.assert_close(losses[key], expected[key], msg=key, **TOL)
        sum(losses.values()).backward()
        sum(expected.values()).backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert (p.grad is None) == (q.grad is None), name
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, msg=name, **TOL)
        opt.step()
        eager_opt.step()
        opt.zero_grad()
        eager_opt.zero_grad()
        with torch.no_grad():
            for (name, p), q in zip(model.named_parameters(), eager.parameters()):
                torch.testing.assert_close(p, q, msg=name, **TOL)
                p.copy_(q)  # (see the doc)
    return jmodel


@pytest.mark.slow
def test_faster_rcnn_training_matches_eager():
    """Faster R-CNN (MobileNetV3 FPN) trained 8 steps, losses, gradients and parameters as eager's,
    in 4 compiles (it compiled at every step: 16 in 16). Box counts of 1 to 3 per image: a compile
    for each of the patterns (1, 1), (2+, 1) and (2+, 2+) of the two targets' counts seen (a count
    of 1 stays constant, as a size of 1 does; both targets' counts turn symbolic together, each
    its own size), and one because the first call set up ``MultiScaleRoIAlign``'s scales (a guard on
    its ``map_levels``, None then). Every count ``nms``, the matcher and the samplers compute that
    differs from the compile before is symbolic in the second compile; a sampler's count of 1
    positive anchor is served by it (traced at 2: a compile of its own before). Over 24 steps: 8
    compiles, the others for 1-patterns too."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3
    ).train()
    start = time.perf_counter()
    jmodel = train_detection_like_eager(model, steps=8)
    stats = thunder_rs.compile_stats(jmodel)
    print(f"compiles {stats.cache_misses} in {time.perf_counter() - start:.1f}s", stats.miss_reasons)
    assert (misses(jmodel), stats.eager_calls) == (4, 0)


class TinyRPN(torch.nn.Module):
    """A conv backbone and torchvision's ``RegionProposalNetwork`` (anchors matched to the targets'
    boxes, ``BalancedPositiveNegativeSampler``'s ``randperm``, ``nms``, losses), kept small."""

    def __init__(self):
        super().__init__()
        from torchvision.models.detection.anchor_utils import AnchorGenerator
        from torchvision.models.detection.rpn import RegionProposalNetwork, RPNHead

        self.body = torch.nn.Conv2d(3, 8, 3, stride=4, padding=1)
        anchors = AnchorGenerator(sizes=((16, 32),), aspect_ratios=((0.5, 1.0, 2.0),))
        self.rpn = RegionProposalNetwork(
            anchors,
            RPNHead(8, 6),
            0.7,
            0.3,
            64,
            0.5,
            dict(training=200, testing=100),
            dict(training=50, testing=50),
            0.7,
        )

    def forward(self, images, targets):
        from torchvision.models.detection.image_list import ImageList

        batch = torch.stack(images)
        features = {"0": self.body(batch).relu()}
        _, losses = self.rpn(ImageList(batch, [tuple(i.shape[-2:]) for i in images]), features, targets)
        return losses


def test_a_region_proposal_network_trains_as_eager():
    """8 steps in 4 compiles (one per step before): a compile for each pattern of the targets'
    box counts (1 or 2+ each: input sizes; the first call's (2+, 2+) compiled constant); the
    matcher's count of 1 is traced at 2 (a compile of its own before, traced at 1)."""
    pytest.importorskip("torchvision")
    torch.manual_seed(0)
    jmodel = train_detection_like_eager(TinyRPN().train(), steps=8, size=64)
    assert (misses(jmodel), thunder_rs.compile_stats(jmodel).eager_calls) == (4, 0)


def check_rows(x):
    torch._assert(x.shape[-1] == 4, f"Expected a tensor of shape [N, 4], got {x.shape}.")
    return x * 2


def test_a_size_in_a_torch_assert_message_specialises_nothing():
    """``torch._assert(cond, f"... {x.shape}")`` builds its message whether the condition holds or
    not (torchvision's detection models check their targets so): the message is read only when it
    fails, as traced, so the size formatted into it is not specialised (it was: a compile per box
    count). A failing call raises eager's message."""
    jfn = thunder_rs.jit(check_rows)
    for n in (2, 3, 5, 7):
        x = torch.randn(n, 4)
        torch.testing.assert_close(jfn(x), check_rows(x))
    assert misses(jfn) == 2
    with pytest.raises(AssertionError, match=re.escape("got torch.Size([3, 5]).")):
        jfn(torch.randn(3, 5))


def rows_text(x):
    return x * 2, f"{x.shape[0]} rows"


def test_a_size_in_text_the_program_keeps_is_specialised():
    jfn = thunder_rs.jit(rows_text)
    for n in (2, 3, 5):
        x = torch.randn(n, 4)
        out, text = jfn(x)
        assert text == f"{n} rows"
        torch.testing.assert_close(out, x * 2)


def torch_choice(x, sizes: list):
    """torchvision's ``GeneralizedRCNNTransform.torch_choice``: a random index by torch's generator."""
    index = int(torch.empty(1).uniform_(0.0, float(len(sizes))).item())
    return x * sizes[index]


@pytest.mark.parametrize("sizes", [[3.0], [2.0, 5.0]])
def test_the_int_of_a_random_float_read_is_what_the_check_compares(sizes):
    """``int(t.item())`` uses the int alone: the check compares it (it compared the float, a new
    value on every draw, so every call compiled a variant). Outputs and the generator as eager's."""
    jfn = thunder_rs.jit(torch_choice)
    x = torch.randn(4)
    for seed in range(6):
        torch.manual_seed(seed)
        got, after = jfn(x, sizes), torch.rand(1)
        torch.manual_seed(seed)
        torch.testing.assert_close(got, torch_choice(x, sizes))
        torch.testing.assert_close(after, torch.rand(1))
    assert misses(jfn) <= len(sizes)


def test_torchvision_code_is_the_users_not_torchs():
    """Reads are placed at the user's frame; torchvision's directory (``.../torchvision``) begins
    like torch's (``.../torch``) and was taken for torch's: every read of a detection model was
    placed at the line calling it, so its reads' sites were one."""
    torchvision = pytest.importorskip("torchvision")
    assert is_user_file(torchvision.ops.boxes.__file__)
    assert not is_user_file(torch.nn.functional.__file__)


def paste(x, box):
    """torchvision's ``paste_mask_in_image``: slice bounds that are 0-dim tensors of a box."""
    start, stop = max(box[0], 0), min(box[1] + 1, x.shape[0])
    out = torch.zeros_like(x)
    out[start:stop] = x[start - box[0] : stop - box[0]] * 2
    return out


def test_tensor_slice_bounds_are_read_as_eager_reads_them():
    """``x[t0:t1]`` with 0-dim integer tensors: eager takes their values (``__index__``); tracing
    refused them (Mask R-CNN's mask pasting). Now read from the call's values, with a check, as
    ``item()``: bounds that change are symbolic sizes of the next compile (one compile per box
    before). Compiles: the first box; its bounds symbolic; ``max(box[0], 0)`` taking the other
    branch. Bounds are counts, which the symbolic variants serve at 0 and 1 too. The first box
    again runs the first variant (found by its values, though a symbolic variant came between),
    and every later box is served."""
    jfn = thunder_rs.jit(paste)
    for box in ([1, 3], [0, 5], [2, 9], [1, 3], [3, 7], [2, 6], [4, 5], [1, 3], [0, 5]):
        x, bt = torch.randn(8), torch.tensor(box)
        torch.testing.assert_close(jfn(x, bt), paste(x, bt))
    assert misses(jfn) == 3


ONE_STAGE = {
    "ssdlite": lambda d: d.ssdlite320_mobilenet_v3_large(num_classes=3, weights=None, weights_backbone=None),
    "fcos": lambda d: d.fcos_resnet50_fpn(
        num_classes=3, min_size=160, max_size=160, weights=None, weights_backbone=None
    ),
    "retinanet": lambda d: d.retinanet_resnet50_fpn(
        num_classes=3, min_size=160, max_size=160, weights=None, weights_backbone=None
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ONE_STAGE))
def test_a_one_stage_detector_trains_as_eager(name):
    """SSDlite, FCOS and RetinaNet (anchors matched to the targets' boxes, focal and IoU losses):
    3 steps in 3 compiles, the first call's and one for each new pattern of box counts (1, then
    2+ boxes in the first target)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    jmodel = train_detection_like_eager(ONE_STAGE[name](torchvision.models.detection).train(), steps=3)
    assert (misses(jmodel), thunder_rs.compile_stats(jmodel).eager_calls) == (3, 0)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ONE_STAGE))
def test_a_one_stage_detector_evaluates_as_eager_over_image_sizes_and_counts(name):
    """Boxes, scores and labels as eager's for 1 and 2 images of 160 and 200 px: a compile per
    number of images and one with symbolic image sizes for each."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = ONE_STAGE[name](torchvision.models.detection).eval()
    jmodel = thunder_rs.jit(model)
    for size, count in [(160, 1), (160, 2), (200, 1), (200, 2)]:
        images = [torch.rand(3, size, size) for _ in range(count)]
        with torch.no_grad():
            outs, expected = jmodel(images), model(images)
        for out, want in zip(outs, expected, strict=True):
            assert out.keys() == want.keys()
            for key in want:
                torch.testing.assert_close(out[key], want[key], msg=f"{size} px, {count} images: {key}", **TOL)
    assert misses(jmodel) == 4
