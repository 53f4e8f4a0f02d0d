"""Mask R-CNN inference over images whose boxes change: ``paste_masks_in_image`` reads each box's
corners and sizes as ints (``int(box[2] - box[0] + 1)``, the slice bounds ``im_mask[y_0:y_1]``),
which turn symbolic once they change, so that one variant serves every image. A random model
makes boxes 1 pixel wide and boxes 1 pixel from the border: ints of 1. Outputs, and the writes a
program makes through views, as eager's; the compile counts bounded."""

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from test_data_dependent import assert_calls_match
from twin_training import misses

pytestmark = pytest.mark.usefixtures("one_thread")


def _boxes(g: torch.Generator, n: int, h: int, w: int) -> torch.Tensor:
    """``n`` boxes (x0, y0, x1, y1) inside an image of ``h`` by ``w`` (clipped to it, as the model's
    are): those at its border cross it once ``paste_masks_in_image`` pads them; one is less than a
    pixel wide, one less than a pixel high, two start a pixel from its left or top."""
    corner = torch.rand(n, 2, generator=g) * torch.tensor([w - 8.0, h - 8.0])
    size = torch.rand(n, 2, generator=g) * 24
    size[0, 0], size[1, 1], corner[2, 0], corner[3, 1] = 0.3, 0.2, 1.2, 1.4
    far = torch.minimum(corner + size, torch.tensor([float(w), float(h)]))
    return torch.cat([corner, far], dim=1)


def test_pasting_masks_into_images_compiles_for_the_first_boxes_then_for_all():
    """Each box's ints are reads at the same lines: one compile for the first image, one with those
    that changed symbolic, one with all of them (each read there). Ints of 1 are traced symbolic at
    a site whose ints are (constant, a 1 at another read on the next image missed the variant). The
    reads' segments (``Recorder.segment``) number their values anew, and a slice's bounds are size
    values in its parameters: they were left with the recording's numbers, and every symbolic
    compile failed (a compile per image)."""
    roi_heads = pytest.importorskip("torchvision.models.detection.roi_heads")

    def paste(masks, boxes):
        return roi_heads.paste_masks_in_image(masks, boxes, (40, 50))

    jfn = thunder_rs.jit(paste)
    g = torch.Generator().manual_seed(0)
    calls = [(torch.rand(6, 1, 28, 28, generator=g), _boxes(g, 6, 40, 50)) for _ in range(6)]
    assert_calls_match(paste, jfn, calls)
    assert misses(jfn) == 2, thunder_rs.compile_stats(jfn).miss_reasons


def sliced_by_ints(x, bounds):
    y = x.clone()
    y[bounds[0] : bounds[1]] = 0
    return x[bounds[0] : bounds[1]] * 2, y


def test_ints_of_1_at_a_site_of_symbolic_ints_are_symbolic_too():
    """A slice bound read at 1 (a box 1 pixel from the border) is a symbolic size at a site whose
    ints are, and turns a site symbolic when it changes to 1: constant there, each call with a 1
    at another read compiled a variant (1 was kept for the counts of output sizes alone)."""
    jfn = thunder_rs.jit(sliced_by_ints)
    bounds = [(2, 5), (1, 6), (3, 7), (1, 2), (4, 9), (5, 6), (1, 1), (2, 8)]
    assert_calls_match(sliced_by_ints, jfn, [(torch.randn(10), torch.tensor(b)) for b in bounds])
    assert misses(jfn) == 2, thunder_rs.compile_stats(jfn).miss_reasons


def rows_written_through_a_reshape(x, n):
    """``x[:h, :3]`` of a ``[5, 4]`` tensor flattened: a view where ``h == 1`` (the write reaches
    ``x``), a copy where ``h >= 2`` (it does not)."""
    v = x[: n.item(), :3].reshape(-1)
    v.mul_(2)
    return v + 1


def rows_written_through_a_view(x, n):
    """Views whose strides need no decision on ``h``: ``[h, 4, 3]`` rows merged (their stride is
    the chunk's whatever ``h``), and an interpolated ``[1, 1, h, w]`` taken as ``[h, w]``."""
    h = n.item()
    merged = x[:h, :, :3].view(h * 4, 3)
    merged.mul_(2)
    resized = F.interpolate(x[None, :1, :, :2], size=(h, 4), mode="bilinear", align_corners=False)
    resized[0][0].add_(1)
    return merged + 1, resized


def _calls_like_eager(program, shape, hs):
    """``program(x, tensor(h))`` for each ``h``, jitted and eager, on equal copies of one ``x``:
    outputs, and ``x`` after the writes, as eager's. Returns the jitted function."""
    jfn = thunder_rs.jit(program)
    for h in hs:
        x = torch.randn(shape)
        x_eager = x.clone()
        torch.testing.assert_close(jfn(x, torch.tensor(h)), program(x_eager, torch.tensor(h)))
        torch.testing.assert_close(x, x_eager)
    return jfn


@pytest.mark.parametrize("hs", [(2, 3, 1, 4, 1, 2), (2, 1, 3, 1, 4, 5)], ids=["1-after", "1-first"])
def test_a_write_through_a_reshape_that_is_a_view_at_1_alone_stays_eagers(hs):
    """Whether the reshape is a view decides on ``h != 1`` (ATen's ``computeStride``): a guard, so
    that the variant for 1 writes ``x`` and the others do not; one variant each side."""
    jfn = _calls_like_eager(rows_written_through_a_reshape, (5, 4), hs)
    assert misses(jfn) == 3, thunder_rs.compile_stats(jfn).miss_reasons


def test_views_whose_strides_do_not_depend_on_a_size_of_1_serve_every_size():
    """A variant traced at ``h == 1`` serves every ``h``: the views' strides are told without a
    decision on it (a contiguous tensor's, and a dim whose stride is its chunk's); the writes
    through them reach ``x`` as in eager."""
    jfn = _calls_like_eager(rows_written_through_a_view, (5, 4, 6), (2, 1, 3, 1, 5, 4))
    assert misses(jfn) == 2, thunder_rs.compile_stats(jfn).miss_reasons


@pytest.mark.slow
def test_mask_rcnn_inference_compiles_three_times_for_any_number_of_images():
    """``maskrcnn_resnet50_fpn`` (random weights, 20 boxes an image) over 5 images: boxes, labels,
    scores and masks as eager's. A compile for the first image, one with the sizes that changed
    since symbolic (``remove_small_boxes``' count, the boxes' ints), one with the ints at the
    sites whose first reads had not changed; every later image runs a variant (it compiled once
    per image, 3-5 times slower than eager)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.detection.maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=3, box_detections_per_img=20, box_score_thresh=0.0
    ).eval()
    jmodel = thunder_rs.jit(model)
    with torch.no_grad():
        for seed in range(5):
            images = [torch.rand(3, 160, 160, generator=torch.Generator().manual_seed(seed))]
            (got,), (expected,) = jmodel(images), model(images)
            assert got.keys() == expected.keys() and len(expected["boxes"]) == 20
            for key in expected:
                torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-4, msg=key)
    assert misses(jmodel) <= 3, thunder_rs.compile_stats(jmodel).miss_reasons
