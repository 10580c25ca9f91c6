"""Collectives built from point-to-point messages: the course's reference code.

Why: `dist.all_reduce` is one opaque call, so the alpha-beta model in
`ddp_teach.cost` would have nothing concrete to describe. Here the same
collectives are written with `dist.isend` / `dist.irecv` alone, so a learner
can count the messages and bytes each algorithm sends, predict its time with
the model, and measure it (benchmarks/ring_vs_gloo.py). These functions are
also the solutions to the course's exercises and the references its checkers
use; each works for any world size >= 1, any tensor length >= 0 (lengths
smaller than the world size or not divisible by it included) and for float
and integer dtypes. They use the default process group.

Each behaves as torch's collective does with a tensor that requires grad
(a parameter, say): it works on the data, and autograd does not record it
(the all-reduces sum in place). Where they differ is a tensor of a
different length on some rank: gloo would abort the process (SIGABRT) when
a message of the wrong size arrives, so each first checks, with one
all-reduce of two integers, that every rank passes as many elements, and
raises a ValueError on every rank if not. That check costs each call one small collective: a
few alphas of latency and no bandwidth, which matters only for tensors
small enough that latency is most of the time. It is traced as "size
check" and is not counted in the costs below.

Cost per rank, with p ranks and a tensor of n bytes (`ddp_teach.cost` has the
formulas; a message costs alpha + bytes * beta):

    naive_allreduce   every rank 1 send + 1 receive of n bytes, but rank 0
                      receives and sends p-1 of them: 2(p-1) messages and
                      2(p-1) n bytes through one rank, one after another
    tree_allreduce    2 ceil(log2 p) rounds of n bytes (reduce, then broadcast)
    ring_allreduce    2(p-1) messages of n/p bytes: 2(p-1)/p n bytes, which is
                      bandwidth-optimal, but 2(p-1) alphas of latency

Sources: R. Thakur, R. Rabenseifner & W. Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1), 2005 (binomial trees, the
alpha-beta model); P. Patarasuk & X. Yuan, "Bandwidth Optimal All-reduce
Algorithms for Clusters of Workstations", JPDC 69(2), 2009 (the ring).
"""
import torch
import torch.distributed as dist

from ddp_teach.tracing import labelled

__all__ = ["ring_allreduce", "ring_reduce_scatter", "ring_all_gather",
           "naive_allreduce", "tree_allreduce", "fixed_collective_order"]


def ring_allreduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum `tensor` over all ranks, in place, like `dist.all_reduce(tensor)`;
    returns `tensor`.

    The ring of Patarasuk & Yuan (2009): split the flattened tensor into p
    chunks, then

    1. reduce-scatter, p-1 steps: at step s rank r sends chunk (r - s) mod p
       to rank r+1 and adds the chunk (r - s - 1) mod p that rank r-1 sends
       it. Afterwards rank r holds the full sum of chunk (r + 1) mod p.
    2. all-gather, p-1 steps: the finished chunks travel once round the ring,
       each rank overwriting the chunk it receives.

    So a ring all-reduce is a ring reduce-scatter followed by a ring
    all-gather (`ring_reduce_scatter`, `ring_all_gather`), the two halves
    sharing the code below. Each rank sends 2(p-1) messages of n/p bytes:
    time 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
    (`ddp_teach.cost.allreduce_time(n, p, link, "ring")`).

    `group`: only the default group (None) is supported. Every rank must
    pass as many elements: checked first, at the cost of one small all-reduce
    (see `_require_same_numel`).
    """
    if group is not None and group is not dist.group.WORLD:
        raise ValueError("ring_allreduce supports only the default process "
                         "group; pass group=None")
    _require_same_numel(tensor, "ring_allreduce")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    owned = (rank + 1) % world_size  # the chunk rank r finishes, as in the paper

    def reduce_then_gather(flat):
        chunks = flat.tensor_split(world_size)
        _reduce_scatter_chunks(chunks, owned)
        _all_gather_chunks(chunks, owned)

    return _in_place(tensor, reduce_then_gather)


def ring_reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's chunk of the sum over all ranks: chunk `rank` of
    `tensor.flatten().tensor_split(world_size)`, summed (a new 1-D tensor;
    `tensor` is left unchanged).

    For a length divisible by the world size this is what
    `dist.reduce_scatter_tensor(output, tensor)` (`reduce_scatter_single` in
    torch 2.13) puts in `output`: rank r gets chunk r. p-1 messages of n/p
    bytes per rank: (p-1) alpha + (p-1)/p n (beta + gamma).
    """
    _require_same_numel(tensor, "ring_reduce_scatter")
    chunks = tensor.detach().flatten().clone().tensor_split(dist.get_world_size())
    _reduce_scatter_chunks(chunks, owned=dist.get_rank())
    return chunks[dist.get_rank()].clone()  # not a view that keeps all chunks


def ring_all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's `tensor`, as a list indexed by source rank, like
    `dist.all_gather`; every rank must pass a tensor of the same shape and
    dtype. p-1 messages of n bytes per rank (n: one rank's tensor):
    (p-1) alpha + (p-1) n beta, which is `ddp_teach.cost`'s
    (p-1) alpha + (p-1)/p N beta for the N = p n bytes gathered.
    """
    _require_same_numel(tensor, "ring_all_gather")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gathered = tensor.new_empty((world_size, tensor.numel()))
    gathered[rank] = tensor.detach().flatten()
    chunks = gathered.unbind()  # row i: rank i's tensor
    _all_gather_chunks(chunks, owned=rank)
    return [chunk.view(tensor.shape) for chunk in chunks]


def naive_allreduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over all ranks, in place, through rank 0; returns `tensor`.

    Every other rank sends its tensor to rank 0 and receives the sum back: one
    message of n bytes each way. Rank 0 receives p-1 messages, sums, and sends
    p-1: its link carries 2(p-1) n bytes, so the time grows linearly with p,
    about 2(p-1)(alpha + n beta). The baseline the other two improve on.
    """
    _require_same_numel(tensor, "naive_allreduce")

    def through_rank_zero(flat):
        world_size = dist.get_world_size()
        if dist.get_rank() != 0:
            dist.send(flat, dst=0)
            dist.recv(flat, src=0)
            return
        received = [torch.empty_like(flat) for _ in range(1, world_size)]
        _wait_all([dist.irecv(buffer, src=source)
                   for source, buffer in enumerate(received, start=1)])
        for buffer in received:
            flat.add_(buffer)
        _wait_all([dist.isend(flat, dst=d) for d in range(1, world_size)])

    return _in_place(tensor, through_rank_zero)


def tree_allreduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over all ranks, in place, on a binomial tree rooted at rank 0;
    returns `tensor`.

    Reduce: each rank adds what its children send, then sends its partial sum
    to its parent. Broadcast: the same tree the other way. Each rank sends at
    most one message of n bytes while reducing and at most ceil(log2 p) while
    broadcasting (rank 0 sends that many); the critical path is
    2 ceil(log2 p) messages of n bytes:
    2 lg p (alpha + n beta) + lg p n gamma
    (`ddp_teach.cost.allreduce_time(n, p, link, "tree")`; Thakur et al. 2005).
    Works for any p: where p is not a power of two some subtrees are missing.
    """
    _require_same_numel(tensor, "tree_allreduce")

    def reduce_then_broadcast(flat):
        parent, children = _binomial_tree(dist.get_rank(), dist.get_world_size())
        received = torch.empty_like(flat)
        for child in children:  # the smallest subtree first: it finishes first
            dist.recv(received, src=child)
            flat.add_(received)
        if parent is not None:
            dist.send(flat, dst=parent)
            dist.recv(flat, src=parent)
        for child in reversed(children):  # the largest subtree first
            dist.send(flat, dst=child)

    return _in_place(tensor, reduce_then_broadcast)


def fixed_collective_order(rank: int, world_size: int):
    """Notebook 00's planted hang, fixed: every rank calls all_reduce, then
    broadcast, in the same order; returns (a, b): the sum of rank + 1 over the
    ranks, and rank 0's b (100).

    Why: a collective matches the calls of every rank in the order they are
    made; rank 0 in all_reduce while rank 1 is in broadcast waits forever
    (torch's TORCH_DISTRIBUTED_DEBUG=DETAIL checks exactly this order,
    torch/csrc/distributed/c10d/ProcessGroupWrapper.cpp). Run with `dt.run`,
    which creates the default group.
    """
    a = torch.tensor([float(rank + 1)])
    b = torch.tensor([float(rank + 100)])
    dist.all_reduce(a)
    dist.broadcast(b, src=0)
    return a.item(), b.item()


def _reduce_scatter_chunks(chunks, owned: int) -> None:
    """Ring reduce-scatter over `chunks` (one per rank), in place: afterwards
    chunks[owned] holds the sum over all ranks. Every rank's `owned` must be
    its rank plus the same offset, so that each rank finishes a different
    chunk. Step s sends chunk owned-1-s to the right and adds the chunk
    owned-2-s that arrives from the left."""
    world_size = len(chunks)
    received = torch.empty_like(chunks[0])  # tensor_split puts the largest first
    for step in range(world_size - 1):
        send_index = (owned - 1 - step) % world_size
        recv_index = (owned - 2 - step) % world_size
        incoming = received[:chunks[recv_index].numel()]
        _exchange_with_neighbours(chunks[send_index], incoming)
        chunks[recv_index].add_(incoming)


def _all_gather_chunks(chunks, owned: int) -> None:
    """Ring all-gather over `chunks`, in place: this rank's finished chunk is
    chunks[owned] (same offset rule as above); afterwards every chunk is. Step
    s forwards chunk owned-s to the right and receives chunk owned-1-s from
    the left straight into place."""
    world_size = len(chunks)
    for step in range(world_size - 1):
        _exchange_with_neighbours(chunks[(owned - step) % world_size],
                                  chunks[(owned - 1 - step) % world_size])


def _exchange_with_neighbours(send: torch.Tensor, receive: torch.Tensor) -> None:
    """Send `send` to the right neighbour while receiving `receive` from the
    left one. Both are posted before either is waited on: were every rank to
    wait on its send first, a ring of blocking sends could deadlock."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    _wait_all([dist.isend(send, dst=(rank + 1) % world_size),
               dist.irecv(receive, src=(rank - 1) % world_size)])


def _wait_all(requests) -> None:
    for request in requests:
        request.wait()


def _binomial_tree(rank: int, world_size: int) -> tuple[int | None, list[int]]:
    """(parent, children) of `rank` in the binomial tree rooted at 0. The
    parent clears the rank's lowest set bit; the children add each smaller
    power of two (rank 0: every power of two below world_size). E.g. with 8
    ranks: 0 -> 1, 2, 4; 2 -> 3; 4 -> 5, 6; 6 -> 7."""
    if rank == 0:
        parent, lowest_bit = None, 1 << (world_size - 1).bit_length()
    else:
        lowest_bit = rank & -rank
        parent = rank - lowest_bit
    smaller_bits = [1 << k for k in range(lowest_bit.bit_length() - 1)]
    return parent, [rank + bit for bit in smaller_bits if rank + bit < world_size]


def _require_same_numel(tensor: torch.Tensor, name: str) -> None:
    """Raise a ValueError on every rank unless every rank's `tensor`
    has as many elements, before any data moves.

    Why: were the lengths to differ, a rank would receive a message of a size
    it did not post, and gloo aborts the process (SIGABRT) with a message
    about sizes that names neither the function nor the tensor. One all-reduce
    (MAX) of (numel, -numel) gives every rank the largest and the smallest
    count at once. Shapes may differ where the counts agree, as for
    `dist.all_reduce`: the algorithms see only the flattened tensor.
    Anything but a tensor is refused first, in words (a list has no numel)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} takes a torch.Tensor, as torch's collectives "
                        f"do; got a {type(tensor).__name__}. Make one first, "
                        "e.g. torch.tensor([1.0, 2.0])")
    counts = torch.tensor([tensor.numel(), -tensor.numel()], device=tensor.device)
    with labelled("size check"):
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    largest, smallest = counts[0].item(), -counts[1].item()
    if largest != smallest:
        raise ValueError(
            f"{name} needs a tensor with the same number of elements on every "
            f"rank, as dist.all_reduce does: this rank's has {tensor.numel()} "
            f"(shape {tuple(tensor.shape)}), and the ranks' range from "
            f"{smallest} to {largest}. Give every rank a tensor of the same "
            f"shape (a rank with less data can pad with zeros).")


def _in_place(tensor: torch.Tensor, algorithm) -> torch.Tensor:
    """Run `algorithm` on a flat contiguous view of `tensor` (a copy when
    `tensor` is not contiguous, copied back), so that the result lands in
    `tensor` as `dist.all_reduce` does; returns `tensor`.

    It works on `tensor.detach()`, the same memory outside autograd, because
    that is what `dist.all_reduce` does: a tensor that requires grad (a
    parameter, or an activation) has its values summed in place, and
    autograd neither records the sum nor refuses the in-place writes."""
    data = tensor.detach()
    flat = data.contiguous().view(-1)  # `tensor`'s own memory if contiguous
    algorithm(flat)
    if not data.is_contiguous():
        data.copy_(flat.view(data.shape))
    return tensor
