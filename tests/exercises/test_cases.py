"""The checkers' shared inputs (ddp_teach/exercises/cases.py): ordered
smallest first, the views really non-contiguous, the values exact when
summed over five ranks, and every call building fresh tensors."""
import torch

from ddp_teach.exercises.cases import (SHAPES, WORLD_SIZES, TensorCase,
                                       container_cases, tensor_cases)


def test_tensor_cases_come_smallest_first_and_cover_every_shape():
    cases = tensor_cases(("float32", "int64"))
    sizes = [case.numel for case in cases]
    assert sizes == sorted(sizes)
    assert {case.shape for case in cases} == set(SHAPES)
    assert cases[0].shape == (0,) and cases[-1].shape == (1000,)


def test_the_views_are_not_contiguous_and_have_the_cases_shape():
    for case in tensor_cases(("float32",), layouts=("transposed", "strided")):
        tensor = case.make(rank=2)
        assert tensor.shape == case.shape, case
        assert not tensor.is_contiguous(), case
    layouts = {case.layout for case in tensor_cases()}
    assert layouts == {"contiguous", "transposed", "strided"}


def test_views_hold_the_same_values_as_their_contiguous_case():
    for shape, layout in (((3, 4), "transposed"), ((13,), "strided")):
        view = TensorCase(shape, "int64", layout).make(rank=1)
        assert view.shape == shape
        # the values differ per rank and per element, whatever the layout
        assert len(set(view.reshape(-1).tolist())) > 1


def test_a_sum_over_five_ranks_is_exact_even_in_float16():
    case = TensorCase((1000,), "float16")
    exact = sum(TensorCase((1000,), "int64").make(r) for r in range(5))
    summed = sum(case.make(r) for r in range(5))
    assert torch.equal(summed.to(torch.int64), exact)
    assert exact.max() == 115  # cases.py's bound; float16 holds every integer up to 2048


def test_ranks_get_different_values_and_requires_grad_is_kept():
    case = TensorCase((5,), "float32", requires_grad=True)
    assert not torch.equal(case.make(0), case.make(1))
    assert case.make(0).requires_grad
    assert WORLD_SIZES == (1, 2, 3, 4, 5)


def test_the_descriptions_name_shape_dtype_and_layout():
    assert TensorCase(()).describe() == "a 0-d float32 tensor (shape ())"
    assert "non-contiguous 3 x 4 int64 view" in TensorCase(
        (3, 4), "int64", "transposed").describe()
    assert "every second element" in TensorCase((5,), layout="strided").describe()


def test_container_cases_build_fresh_inputs_and_end_with_namedtuples():
    cases = container_cases()
    first = cases[0]
    assert first.build() is not first.build()
    assert first.describe() == "a 1 x 2 batch over 1 device"
    assert hasattr(cases[-2].build(), "_fields")  # the namedtuple itself
    assert {c.devices for c in cases} == set(WORLD_SIZES)
    assert any(isinstance(c.build(), torch.Tensor) and not c.build().is_contiguous()
               for c in cases)
