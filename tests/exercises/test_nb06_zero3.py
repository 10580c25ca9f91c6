"""Notebook 06's planted mistakes for its ZeRO-3 exercise (PLANTED, run by
test_registry.py, which also checks every reference and stub): each must
get the hint that fits. The last four are the second attempt's mistakes:
the forward under no_grad, the pieces not viewed to their shapes, the
gathered tensors assigned to the meta module, and loaded into it."""
import torch
import torch.distributed as dist

from ddp_teach.zero import gathered_forward


def _gathered(shard):
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    dist.all_gather_single(full, shard)
    return full


def _pieces(module, flat):
    sizes = [p.numel() for p in module.parameters()]
    return flat[:sum(sizes)].split(sizes)


def run_with(module, flat, x):
    params = {n: piece.view(p.shape) for (n, p), piece
              in zip(module.named_parameters(), _pieces(module, flat))}
    return torch.func.functional_call(module, params, (x,))


def shard_only(module, shard, x):
    sizes = [p.numel() for p in module.parameters()]
    params = dict(zip([n for n, _ in module.named_parameters()],
                      shard.split(sizes)))  # too short: raises
    return torch.func.functional_call(module, params, (x,))


def keeps_the_full_params(module, shard, x):
    full = _gathered(shard)
    module.gathered = full  # "cached" for next time: never freed
    return run_with(module, full, x)


def own_shard_first(module, shard, x):
    chunks = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(chunks, shard)
    rank = dist.get_rank()
    full = torch.cat([shard] + [c for r, c in enumerate(chunks) if r != rank])
    return run_with(module, full, x)


def padding_kept(module, shard, x):
    sizes = [p.numel() for p in module.parameters()]
    pieces = _gathered(shard).split(sizes)  # 59 of 60 elements: raises
    params = {n: piece.view(p.shape) for (n, p), piece
              in zip(module.named_parameters(), pieces)}
    return torch.func.functional_call(module, params, (x,))


# ---- the second attempt ---------------------------------------------------------

def under_no_grad(module, shard, x):
    with torch.no_grad():  # "the gathered weights need no gradient"
        return gathered_forward(module, shard, x)


def pieces_not_viewed(module, shard, x):
    params = dict(zip([n for n, _ in module.named_parameters()],
                      _pieces(module, _gathered(shard))))  # flat pieces
    return torch.func.functional_call(module, params, (x,))


def assigned_to_the_module(module, shard, x):
    for (name, p), piece in zip(list(module.named_parameters()),
                                _pieces(module, _gathered(shard))):
        owner, attribute = name.rsplit(".", 1)
        setattr(module.get_submodule(owner), attribute, piece.view(p.shape))
    return module(x)


def loaded_into_the_meta_module(module, shard, x):
    params = {n: piece.view(p.shape) for (n, p), piece
              in zip(module.named_parameters(), _pieces(module, _gathered(shard)))}
    module.load_state_dict(params)  # copies into meta tensors: nothing lands
    return module(x)


def clones_every_piece(module, shard, x):
    """Each parameter copied out of the gathered vector, which stays
    alive beside the copies: the unit held about twice while it runs."""
    full = _gathered(shard)
    params = {n: piece.view(p.shape).clone() for (n, p), piece
              in zip(module.named_parameters(), _pieces(module, full))}
    return torch.func.functional_call(module, params, (x,))


# right answers in other styles (issue 34)

def all_reduce_of_a_padded_buffer(module, shard, x):
    """Each rank puts its shard at its place in a zero buffer; a SUM
    all-reduce assembles the whole: right, at twice the bytes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    full = shard.new_zeros(shard.numel() * world)
    full[rank * shard.numel():(rank + 1) * shard.numel()] = shard
    dist.all_reduce(full)
    return run_with(module, full, x)


def list_gather_and_offsets(module, shard, x):
    """A list all-gather (skipped on one rank, where the shard is
    everything), then the parameters cut with a running offset."""
    world = dist.get_world_size()
    if world == 1:
        flat = shard
    else:
        pieces = [torch.empty_like(shard) for _ in range(world)]
        dist.all_gather(pieces, shard)
        flat = torch.cat(pieces)
    params, offset = {}, 0
    for name, p in module.named_parameters():
        params[name] = flat[offset:offset + p.numel()].reshape(p.shape)
        offset += p.numel()
    return torch.func.functional_call(module, params, x)


def test_other_gathers_are_right(verdict):
    passed, seen = verdict("zero3_gather_forward", all_reduce_of_a_padded_buffer)
    assert passed and "twice an all-gather's traffic" in seen, seen
    passed, seen = verdict("zero3_gather_forward", list_gather_and_offsets)
    assert passed and "all-reduce" not in seen, seen


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("zero3_gather_forward", shard_only, "all-gather every rank's shard first"),
    ("zero3_gather_forward", keeps_the_full_params, "still held after it returned"),
    ("zero3_gather_forward", clones_every_piece,
     ("on 3 ranks", "while the forward ran", "one full copy of a unit at a time")),
    ("zero3_gather_forward", own_shard_first, "the chunks are out of order"),
    ("zero3_gather_forward", padding_kept, "padded to a multiple of the world size"),
    ("zero3_gather_forward", under_no_grad, "do not run the forward under torch.no_grad()"),
    ("zero3_gather_forward", pieces_not_viewed, "view each piece to its parameter's shape"),
    ("zero3_gather_forward", assigned_to_the_module, "cannot be replaced by assigning"),
    ("zero3_gather_forward", loaded_into_the_meta_module, ("meta device", "loading values")),
]
