"""Every test in tests/gpu checks a CUDA or nccl path of the course, and is
marked `gpu`: `make test-gpu` runs just these. Without a CUDA device they
are skipped, each with the reason, so `make test` stays green on a laptop
and CI while a machine with GPUs checks them with one command."""
import pytest
import torch

NO_CUDA = ("no CUDA device here: this test checks a GPU path of the course "
           "(nccl, CUDA tensors); run `make test-gpu` on a machine with GPUs")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in item.nodeid:
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason=NO_CUDA))
