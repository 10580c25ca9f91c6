"""Notebook 02's planted mistakes for scatter and gather (PLANTED, run by
test_registry.py, which also checks every reference and stub): each must get
the hint that names it. Below them, what no answer may do to the checkers."""
import pytest
import torch

from ddp_teach import dp


def detached(obj):
    """obj with every tensor in it detached (containers kept)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, dict):
        return type(obj)((k, detached(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        items = [detached(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj


def split_evenly(inputs, devices):
    return list(inputs.tensor_split(len(devices)))


def tensors_only(inputs, devices):
    return list(inputs.chunk(len(devices)))


def always_n_pieces(inputs, devices):
    pieces = list(inputs.chunk(len(devices)))
    return pieces + [inputs[:0]] * (len(devices) - len(pieces))


def split_by_size(inputs, devices):
    """torch.split(x, k) cuts pieces OF k rows, not k pieces."""
    return dp.scatter(inputs, devices) if not isinstance(inputs, torch.Tensor) \
        else list(inputs.split(len(devices)))


def along_features(inputs, devices):
    return dp.scatter(inputs, devices) if not isinstance(inputs, torch.Tensor) \
        else list(inputs.chunk(len(devices), dim=-1))


def tuples_become_lists(inputs, devices):
    return [list(p) if isinstance(p, tuple) else p for p in dp.scatter(inputs, devices)]


def every_nth_row(inputs, devices):
    """Deals the rows out like cards: piece i is rows i, i + n, ..."""
    n = len(devices)
    if not isinstance(inputs, torch.Tensor):
        return dp.scatter(inputs, devices)
    return [p for p in (inputs[i::n] for i in range(n)) if len(p)]


def not_regrouped(inputs, devices):
    """Splits every tensor in place and returns the input's own structure."""
    if isinstance(inputs, torch.Tensor):
        return list(inputs.chunk(len(devices)))
    if isinstance(inputs, dict):
        return {k: not_regrouped(v, devices) for k, v in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(not_regrouped(v, devices) for v in inputs)
    return inputs


def scatter_detached(inputs, devices):
    return dp.scatter(detached(inputs), devices)


def gather_detached(outputs, target):
    """The issue's example: DataParallel then trains with no gradient."""
    return dp.gather(detached(outputs), target)


def gather_along_features(outputs, target):
    return torch.cat(outputs, dim=1)


def gather_adds(outputs, target):
    return sum(outputs)


def gather_vstack(outputs, target):
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.vstack(outputs)
    if isinstance(first, dict):
        return {k: gather_vstack([o[k] for o in outputs], target) for k in first}
    return type(first)(gather_vstack(list(column), target) for column in zip(*outputs))


def gather_with_torch_tensor(outputs, target):
    return torch.tensor(outputs)


def gather_tuple_as_list(outputs, target):
    joined = dp.gather(outputs, target)
    return list(joined) if isinstance(joined, tuple) else joined


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("dp_scatter", split_evenly, "not tensor_split"),
    ("dp_scatter", tensors_only, "keep the container"),
    ("dp_scatter", always_n_pieces, "do not make empty ones"),
    ("dp_scatter", split_by_size, "torch.split(x, k) cuts pieces of k rows"),
    ("dp_scatter", along_features, "split along dimension 0 (the batch)"),
    ("dp_scatter", tuples_become_lists, ("must be a tuple again", "got a list")),
    ("dp_scatter", scatter_detached, ("cut off from its autograd graph", ".detach()")),
    ("dp_scatter", every_nth_row, "not every n-th row (x[i::n])"),
    ("dp_scatter", not_regrouped, "regroup the pieces"),
    ("dp_gather", lambda outputs, target: torch.stack(outputs), "torch.stack adds a dimension"),
    ("dp_gather", lambda outputs, target: torch.cat(outputs[::-1]), "keep the devices' order"),
    ("dp_gather", lambda outputs, target: torch.cat(outputs) if isinstance(
        outputs[0], torch.Tensor) else (torch.cat([o[0] for o in outputs]),
                                        outputs[0][1]), "element by element"),
    ("dp_gather", gather_detached, ("would train with no gradient", ".detach()")),
    ("dp_gather", gather_along_features, "join along dimension 0 (the batch)"),
    ("dp_gather", gather_adds, "it does not add them"),
    ("dp_gather", gather_tuple_as_list, ("is a tuple too (got a list)", "type(first)")),
    ("dp_gather", gather_vstack, "torch.vstack (and row_stack) turn each 1-D tensor into a row"),
    ("dp_gather", gather_with_torch_tensor, "torch.tensor(...) builds a new tensor"),
]

ODD_RETURNS = [None, 42, "text", [], [None], [torch.tensor(1.0)] * 3, (), {"a": 1},
               iter([]), [torch.zeros(0)] * 3, torch.tensor(1.0)]
NOTEBOOK_02 = ["dp_scatter", "dp_gather", "dp_replicate", "dp_parallel_apply",
               "data_parallel"]


@pytest.mark.parametrize("name", NOTEBOOK_02)
@pytest.mark.parametrize("odd", ODD_RETURNS, ids=repr)
def test_an_odd_return_value_is_a_wrong_answer_never_an_internal_error(name, odd, verdict):
    """Whatever comes back, the checker says what it got; its own code never
    fails (which check() would show as an error of the learner's)."""
    def my_function(*args):
        return odd
    passed, seen = verdict(name, my_function)
    assert not passed and "❌" in seen, seen
    assert "raised" not in seen and "Error" not in seen, seen


def test_scatter_hint_for_tensor_split_shows_the_smallest_case_and_both_sizes(verdict):
    """2 rows on 3 devices is the smallest batch where tensor_split and
    chunk differ: the verdict shows it, the hint says how chunk cuts."""
    passed, seen = verdict("dp_scatter", split_evenly)
    assert "scattering a 2 x 2 batch over 3 devices" in seen, seen
    assert "got [tensor(1, 2), tensor(1, 2), tensor(0, 2)]" in seen, seen
    assert "10 on 3 devices is 4, 4, 2" in seen, seen


def test_a_scatter_that_ignores_namedtuples_gets_the_namedtuple_hint(verdict):
    def scatter_tuples_by_iterable(inputs, devices):
        if isinstance(inputs, tuple) and inputs:
            columns = [dp.scatter(item, devices) for item in inputs]
            return [type(inputs)(row) for row in zip(*columns)]
        return dp.scatter(inputs, devices)
    passed, seen = verdict("dp_scatter", scatter_tuples_by_iterable)
    assert not passed and "a namedtuple Batch(inputs, labels)" in seen, seen
    assert "type(obj)(*items)" in seen, seen


def test_a_wrong_value_is_shown_with_the_first_element_that_differs(verdict):
    def scatter_off_by_one_row(inputs, devices):
        if isinstance(inputs, torch.Tensor) and len(inputs) > 1:
            return [p + (i > 0) for i, p in enumerate(inputs.chunk(len(devices)))]
        return dp.scatter(inputs, devices)
    passed, seen = verdict("dp_scatter", scatter_off_by_one_row)
    assert "scattering a 2 x 2 batch over 3 devices" in seen, seen
    assert "first difference: tensor 1 (shape (1, 2)) at [0, 0]: expected 2, got 3" in seen, seen


def test_gather_shows_the_values_when_the_shapes_agree(verdict):
    passed, seen = verdict("dp_gather", lambda outputs, target: torch.cat(outputs) * 2)
    # the smallest case: one device, one row
    assert not passed and "a 1 x 2 batch over 1 device" in seen, seen
    assert "at [0, 1]: expected 1, got 2" in seen, seen
    assert "expected [0, 1], got [0, 2]" in seen, seen


# ---- tried as a learner would (issue 34) ----------------------------------------

def gather_ignoring_the_target(outputs, target):
    """Joins right, but leaves the result where the pieces were."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs)
    if isinstance(first, dict):
        return {k: gather_ignoring_the_target([o[k] for o in outputs], target)
                for k in first}
    items = [gather_ignoring_the_target(list(c), target) for c in zip(*outputs)]
    return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)


def gather_by_recursion_with_map(outputs, target):
    """Right, in another style: moved first, then joined, a dict rebuilt
    with a comprehension and sequences with map."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat([o.to(target) for o in outputs], dim=0)
    if isinstance(first, dict):
        return type(first)({k: gather_by_recursion_with_map([o[k] for o in outputs],
                                                            target) for k in first})
    rebuild = type(first)._make if hasattr(first, "_fields") else type(first)
    return rebuild(map(lambda column: gather_by_recursion_with_map(list(column),
                                                                   target),
                       zip(*outputs)))


def scatter_left_on_the_cpu(inputs, devices):
    """Cuts right, but never moves a piece to its device."""
    return dp.scatter(inputs, ["cpu"] * len(devices))


def scatter_with_tensor_split_and_zip(inputs, devices):
    """Right, in another style: pieces of ceil(rows / n) rows by split,
    containers rebuilt by zip, each piece moved as it is made."""
    n = len(devices)
    if isinstance(inputs, torch.Tensor):
        size = -(-len(inputs) // n) if len(inputs) else 1
        return [piece.to(device) for piece, device
                in zip(inputs.split(size), devices)]
    if isinstance(inputs, (tuple, list)) and inputs:
        columns = [scatter_with_tensor_split_and_zip(item, devices) for item in inputs]
        if hasattr(inputs, "_fields"):  # a namedtuple
            return [type(inputs)._make(row) for row in zip(*columns)]
        return [type(inputs)(row) for row in zip(*columns)]
    if isinstance(inputs, dict) and inputs:
        columns = {k: scatter_with_tensor_split_and_zip(v, devices)
                   for k, v in inputs.items()}
        return [type(inputs)(zip(columns, row)) for row in zip(*columns.values())]
    return [inputs for _ in devices]


def test_a_scatter_in_another_style_passes(verdict):
    passed, seen = verdict("dp_scatter", scatter_with_tensor_split_and_zip)
    assert passed, seen


def test_a_gather_in_another_style_passes(verdict):
    passed, seen = verdict("dp_gather", gather_by_recursion_with_map)
    assert passed, seen


PLANTED += [
    ("dp_gather", gather_ignoring_the_target, ("onto target \"meta\"", ".to(target)")),
    ("dp_scatter", scatter_left_on_the_cpu, ("must be on devices[d]", "piece.to(device)")),
]
