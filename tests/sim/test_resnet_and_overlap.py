"""ResNet-50's shapes for the simulator, and the schedule without overlap
that the DDP paper's figure is measured against."""
import pytest
import torch

from ddp_teach.cost import Link
from ddp_teach.models import resnet50
from ddp_teach.sim import Simulation
from ddp_teach.sim.schedules import predict


def test_resnet50_has_the_papers_parameter_count_and_runs():
    meta = resnet50(device="meta")
    assert sum(p.numel() for p in meta.parameters()) == 25_557_032  # 25.6 M
    assert all(p.is_meta for p in meta.parameters()), "no memory on meta"
    torch.manual_seed(0)
    out = resnet50(num_classes=10)(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


@pytest.fixture(scope="module")
def resnet_profile():
    model = resnet50(device="meta")
    return predict.profile(
        model, lambda m: m(torch.empty(8, 3, 224, 224, device="meta")).sum(),
        Simulation("A100 80GB", "100GbE"))


def on(prof, link):
    return predict.Profile(prof.forward_s, prof.backward_s, prof.ready,
                           Simulation("A100 80GB", link))


def test_overlap_hides_communication_behind_backward(resnet_profile):
    slow = on(resnet_profile, "100GbE")
    overlapped = predict.bucketed_ddp(slow, 32)
    after = predict.bucketed_ddp(slow, 32, overlap=False)
    assert predict.compute_only(slow) < overlapped < after
    free = on(resnet_profile, Link(0.0, 0.0))
    assert predict.bucketed_ddp(free, 32) == pytest.approx(
        predict.bucketed_ddp(free, 32, overlap=False)), \
        "with nothing to send, overlap changes nothing"


def test_one_bucket_leaves_nothing_to_overlap(resnet_profile):
    slow = on(resnet_profile, "100GbE")
    assert predict.bucketed_ddp(slow, 8, bucket_cap_mb=None) == pytest.approx(
        predict.bucketed_ddp(slow, 8, bucket_cap_mb=None, overlap=False))


@pytest.mark.parametrize("cap", [-1, float("nan"), "25"])
def test_a_bad_bucket_cap_is_refused_as_by_the_course_ddp(resnet_profile, cap):
    with pytest.raises(ValueError, match="bucket_cap_mb must be a number >= 0 or None"):
        predict.bucketed_ddp(on(resnet_profile, "100GbE"), 8, bucket_cap_mb=cap)
