"""Notebook 09's planted mistakes (PLANTED, run by test_registry.py, which
also checks every reference and stub): each must get the hint that fits."""
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


# ---- strip_ddp_prefix -------------------------------------------------------------

def replace_everywhere(state_dict):
    return {key.replace("module.", ""): value for key, value in state_dict.items()}


def cuts_seven_characters(state_dict):
    return {key[len("module."):]: value for key, value in state_dict.items()}


def keeps_the_prefix(state_dict):
    return dict(state_dict)


# ---- differing_tensors ------------------------------------------------------------

def _gathered(tensor):
    copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, tensor.detach().contiguous())
    return copies


def compares_sums(model):
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [name for name, t in named
            if len({s.item() for s in _gathered(t.detach().double().sum())}) > 1]


def compares_with_allclose(model):
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [name for name, t in named
            if not all(torch.allclose(c, t) for c in _gathered(t))]


def parameters_only(model):
    return [name for name, t in model.named_parameters()
            if not all(torch.equal(c, t) for c in _gathered(t))]


def against_rank_0_only_on_rank_0(model):
    """Each rank compares its own copy with rank 0's broadcast: rank 0 never
    sees a difference, the others see only their own."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    found = []
    for name, t in named:
        reference = t.detach().clone()
        dist.broadcast(reference, src=0)
        if not torch.equal(reference, t):
            found.append(name)
    return found


# ---- nonfinite_ranks --------------------------------------------------------------

def all_reduces_the_loss(loss):
    total = loss.clone()
    dist.all_reduce(total)
    bad = not torch.isfinite(total)
    return list(range(dist.get_world_size())) if bad else []


def only_itself(loss):
    return [dist.get_rank()] if not torch.isfinite(loss) else []


def nan_but_not_inf(loss):
    flags = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, torch.tensor([float(bool(loss != loss))]))
    return [rank for rank, flag in enumerate(flags) if flag.item()]


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("dataset_mean", mean_of_means, "the mean of the ranks' means"),
    ("dataset_mean", sum_only, "that is the sum over every rank"),
    ("dataset_mean", assumes_equal_counts, "assumes every rank holds as many"),
    ("dataset_mean", local_mean, "this rank's own mean"),
    ("strip_ddp_prefix", replace_everywhere, "replace() removed 'module.' everywhere"),
    ("strip_ddp_prefix", cuts_seven_characters, "these keys had no prefix"),
    ("strip_ddp_prefix", keeps_the_prefix, "still start with 'module.'"),
    ("differing_tensors", compares_sums, "two rows swapped"),
    ("differing_tensors", compares_with_allclose, "not allclose"),
    ("differing_tensors", parameters_only, "buffers drift too"),
    ("differing_tensors", against_rank_0_only_on_rank_0, "the ranks returned different lists"),
    ("nonfinite_ranks", all_reduces_the_loss, "the NaN went through a collective"),
    ("nonfinite_ranks", only_itself, "the ranks answered differently"),
    ("nonfinite_ranks", nan_but_not_inf, "an inf is not a NaN"),
]
