"""`dt.system`: the backend "auto" picks, with the GPU count faked so that
the GPU branches are checked on a machine without one too."""
import pytest

from ddp_teach import system


@pytest.mark.parametrize("gpus, world_size, expected", [
    (0, 2, "gloo"), (1, 2, "gloo"), (2, 2, system.GPU_AND_CPU), (8, 4, system.GPU_AND_CPU)])
def test_auto_takes_nccl_and_gloo_together_only_with_a_gpu_per_rank(
        monkeypatch, gpus, world_size, expected):
    monkeypatch.setattr(system, "gpu_count", lambda: gpus)
    assert system.choose_backend("auto", world_size) == expected


def test_nccl_without_a_gpu_per_rank_is_refused_with_what_to_do(monkeypatch):
    monkeypatch.setattr(system, "gpu_count", lambda: 1)
    with pytest.raises(ValueError, match=r"world_size=2 but this machine has 1.*'gloo'"):
        system.choose_backend("nccl", 2)
    assert system.choose_backend("gloo", 2) == "gloo"


def test_an_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match="auto, gloo, nccl"):
        system.choose_backend("mpi", 2)


@pytest.mark.parametrize("backend, nccl", [
    ("gloo", False), ("nccl", True), (system.GPU_AND_CPU, True)])
def test_uses_nccl_reads_the_backend_as_get_backend_names_it(backend, nccl):
    assert system.uses_nccl(backend) is nccl
