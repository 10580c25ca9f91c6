"""Notebook 11's metric and checkpoint exercises: planted mistakes (PLANTED,
run by test_registry.py, which also checks every reference and stub), each
of which must get the hint that names it. The first group of each exercise
breaks one property each of those the checker's docstring lists; the second
group are mistakes found by trying the exercise again, after the checker
was written."""
import torch
import torch.distributed as dist


# ---- dataset_mean ---------------------------------------------------------------

def mean_of_means(local_losses):
    mean = local_losses.mean()
    dist.all_reduce(mean)
    return mean / dist.get_world_size()


def sum_only(local_losses):
    total = local_losses.sum()
    dist.all_reduce(total)
    return total


def assumes_equal_counts(local_losses):
    total = local_losses.sum()
    dist.all_reduce(total)
    return total / (local_losses.numel() * dist.get_world_size())


def local_mean(local_losses):
    return local_losses.mean()


def nan_on_the_empty_rank(local_losses):
    """Sums and counts, but each rank's sum made from its mean: 0/0 on a
    rank with no values."""
    n = float(local_losses.numel())
    both = torch.stack([local_losses.mean() * n, torch.tensor(n)])
    dist.all_reduce(both)
    return both[0] / both[1]


# second attempt: mistakes of our own, not in the list above

def reduced_to_rank_0_only(local_losses):
    both = torch.stack([local_losses.sum(), torch.tensor(float(local_losses.numel()))])
    dist.reduce(both, dst=0)
    return both[0] / both[1]


def divides_by_the_world_size(local_losses):
    total = local_losses.sum()
    dist.all_reduce(total)
    return total / dist.get_world_size()


def centres_the_callers_tensor(local_losses):
    """Right mean, but the caller's values centred in place (for a variance
    computed next)."""
    both = torch.stack([local_losses.sum(), torch.tensor(float(local_losses.numel()))])
    dist.all_reduce(both)
    mean = both[0] / both[1]
    local_losses.sub_(mean)
    return mean


# ---- strip_ddp_prefix -------------------------------------------------------------

def replace_everywhere(state_dict):
    return {key.replace("module.", ""): value for key, value in state_dict.items()}


def cuts_seven_characters(state_dict):
    return {key[len("module."):]: value for key, value in state_dict.items()}


def keeps_the_prefix(state_dict):
    return dict(state_dict)


def strips_characters_with_lstrip(state_dict):
    return {key.lstrip("module."): value for key, value in state_dict.items()}


# second attempt: mistakes of our own, not in the list above

def splits_at_module(state_dict):
    return {key.split("module.")[-1]: value for key, value in state_dict.items()}


def strips_every_leading_module(state_dict):
    renamed = {}
    for key, value in state_dict.items():
        while key.startswith("module."):
            key = key[len("module."):]
        renamed[key] = value
    return renamed


def renames_in_place(state_dict):
    for key in list(state_dict):
        state_dict[key.removeprefix("module.")] = state_dict.pop(key)
    return state_dict


def copies_the_values_wrongly(state_dict):
    return {key.removeprefix("module."): torch.zeros_like(value)
            for key, value in state_dict.items()}


# tried as a learner would (issue 34)

def prefix_word_without_its_dot(state_dict):
    """startswith("module") without the dot: cuts 'module_norm.weight'."""
    return {(key[7:] if key.startswith("module") else key): value
            for key, value in state_dict.items()}


def with_a_regular_expression(state_dict):
    """Right, in another style: a regular expression anchored at the start."""
    import re
    return {re.sub(r"^module\.", "", key, count=1): value
            for key, value in state_dict.items()}


def with_torchs_own_helper(state_dict):
    """Right, in another style: torch's consume_prefix_in_state_dict_if_present
    on a copy (it renames in place, so never on the caller's dict)."""
    from collections import OrderedDict

    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
    copy = OrderedDict(state_dict)
    consume_prefix_in_state_dict_if_present(copy, "module.")
    return dict(copy)


def mean_with_an_unwaited_all_reduce(local_losses):
    """Right when the all-reduce happens to land before it is read."""
    both = torch.stack([local_losses.sum(), torch.tensor(float(local_losses.numel()))])
    dist.all_reduce(both, async_op=True)
    return both[0] / both[1]


def mean_with_a_waited_all_reduce(local_losses):
    """Right, in another style: async, waited, float64."""
    both = torch.tensor([local_losses.double().sum().item(), local_losses.numel()],
                        dtype=torch.float64)
    dist.all_reduce(both, async_op=True).wait()
    return (both[0] / both[1]).item()


def test_a_waited_async_mean_passes(verdict):
    passed, seen = verdict("dataset_mean", mean_with_a_waited_all_reduce)
    assert passed, seen


def test_strip_prefix_in_other_styles_passes(verdict):
    for right in (with_a_regular_expression, with_torchs_own_helper):
        passed, seen = verdict("strip_ddp_prefix", right)
        assert passed, seen


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("dataset_mean", mean_of_means, "the mean of the ranks' means"),
    ("dataset_mean", sum_only, "that is the sum over every rank"),
    ("dataset_mean", assumes_equal_counts, "assumes every rank holds as many"),
    ("dataset_mean", local_mean, "this rank's own mean"),
    ("dataset_mean", nan_on_the_empty_rank, ("NaN: rank 2 holds no values", "0/0")),
    ("dataset_mean", reduced_to_rank_0_only, "dist.reduce?"),
    ("dataset_mean", divides_by_the_world_size, "number of RANKS"),
    ("dataset_mean", centres_the_callers_tensor, "the right mean, but your function changed the caller's local_losses"),
    ("strip_ddp_prefix", replace_everywhere, "replace() removed 'module.' everywhere"),
    ("strip_ddp_prefix", cuts_seven_characters, "these keys had no prefix"),
    ("strip_ddp_prefix", keeps_the_prefix, "still start with 'module.'"),
    ("strip_ddp_prefix", strips_characters_with_lstrip, ("str.lstrip('module.')", "bed.weight")),
    ("strip_ddp_prefix", splits_at_module, "key.split('module.') cuts"),
    ("strip_ddp_prefix", strips_every_leading_module, "removed more than once"),
    ("strip_ddp_prefix", renames_in_place, "changed the dict it was given"),
    ("strip_ddp_prefix", copies_the_values_wrongly, "keep each value as it is"),
    ("strip_ddp_prefix", prefix_word_without_its_dot,
     ("starts with 'module' but not with 'module.'", "startswith('module.')")),
    ("dataset_mean", mean_with_an_unwaited_all_reduce, ("never waited for",
                                                        "work.wait()")),
]
