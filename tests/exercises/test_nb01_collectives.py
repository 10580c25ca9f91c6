"""Notebook 01's checkers: the planted mistakes (PLANTED, run by
test_registry.py, which also checks every reference and stub), and what
only these exercises show: the world sizes tried, a hand-written ring, the
expected-against-got table, `hint`, `solution`, `solution_cell`."""
import numpy as np
import pytest
import torch
import torch.distributed as dist

import ddp_teach.exercises as ex


def check(name, fn, capsys):
    """(passed, what the learner saw)."""
    passed = ex.check(name, fn)
    return passed, capsys.readouterr().out


def ring(tensor, all_gather_shift=0, blocking=False, read_early=False,
         batched=False, split=None, detach=True, copy_back=True):
    """A ring all-reduce with knobs for classic mistakes (and for
    batch_isend_irecv, which is right too). `split(flat, p)` cuts the flat
    tensor into chunks (tensor_split unless given). A non-contiguous tensor
    is worked on as a flat copy, copied back at the end (unless not
    copy_back: the reshape(-1) mistake)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    target = tensor.detach() if detach else tensor
    flat = target.reshape(-1)
    chunks = list(split(flat, world) if split else flat.tensor_split(world))
    right, left = (rank + 1) % world, (rank - 1) % world

    def exchange(send_index, recv_index, combine):
        incoming = torch.empty_like(chunks[recv_index])
        if blocking:  # every rank sends first: deadlock
            dist.send(chunks[send_index].clone(), right)
            dist.recv(incoming, left)
        elif batched:
            works = dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, chunks[send_index].clone(), right),
                 dist.P2POp(dist.irecv, incoming, left)])
            for work in works:
                work.wait()
        else:
            works = [dist.isend(chunks[send_index].clone(), right),
                     dist.irecv(incoming, left)]
            if read_early:  # waits for its send only: the receive may not be in
                works[0].wait()
                combine(chunks[recv_index], incoming)
                works[1].wait()
                return
            for work in works:
                work.wait()
        combine(chunks[recv_index], incoming)

    for step in range(world - 1):
        exchange((rank - step) % world, (rank - step - 1) % world,
                 lambda mine, theirs: mine.add_(theirs))
    for step in range(world - 1):
        start = rank + 1 + all_gather_shift
        exchange((start - step) % world, (start - step - 1) % world,
                 lambda mine, theirs: mine.copy_(theirs))
    if copy_back and flat.data_ptr() != target.data_ptr():
        target.copy_(flat.view_as(target))


def averaged(tensor):
    dist.all_reduce(tensor)
    if tensor.is_floating_point():
        tensor /= dist.get_world_size()
    else:
        tensor //= dist.get_world_size()


def without_own_data(tensor):
    everyone = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, tensor)
    tensor.copy_(sum(t for r, t in enumerate(everyone) if r != dist.get_rank()))


def not_in_place(tensor):
    result = tensor.clone()
    dist.all_reduce(result)
    tensor = result  # rebinds a local name: the caller's tensor is unchanged
    return tensor


def stub(*args):
    raise NotImplementedError("your turn")


def whole_tensor_ring(tensor):
    """Right sums, but every step passes a whole tensor round the ring:
    (p-1) n bytes out per rank where a ring of chunks sends 2(p-1)/p n."""
    world, rank = dist.get_world_size(), dist.get_rank()
    total, passing = tensor.detach().clone(), tensor.detach().contiguous().clone()
    for _ in range(world - 1):
        incoming = torch.empty_like(passing)
        works = [dist.isend(passing, (rank + 1) % world),
                 dist.irecv(incoming, (rank - 1) % world)]
        for work in works:
            work.wait()
        total += incoming
        passing = incoming
    tensor.detach().copy_(total)


def uses_all_reduce(tensor):
    dist.all_reduce(tensor)


def test_the_reference_ring_allreduce_is_correct(capsys):
    from ddp_teach.collectives import ring_allreduce
    passed, seen = check("ring_allreduce", ring_allreduce, capsys)
    assert passed and "✅" in seen and "world sizes (1, 2, 3, 4, 5)" in seen


def test_a_correct_hand_written_ring_passes(capsys):
    """It works on tensor.detach(), as the reference and dist.all_reduce
    do, so the tensor that requires grad passes too."""
    assert check("ring_allreduce", ring, capsys)[0]


def test_a_ring_of_batch_isend_irecv_passes_where_receives_land_at_wait(capsys):
    assert check("ring_allreduce", lambda t: ring(t, batched=True), capsys)[0]


def gather_by_step(tensor):
    """Puts what arrives at step s in slot s: the right tensors, wrong places."""
    from ddp_teach.collectives import ring_all_gather
    everyone = ring_all_gather(tensor)
    rank = dist.get_rank()
    return everyone[rank:] + everyone[:rank]


def gather_without_own(tensor):
    from ddp_teach.collectives import ring_all_gather
    everyone = ring_all_gather(tensor)
    everyone[dist.get_rank()] = torch.zeros_like(tensor)
    return everyone


def gather_ring(tensor, own=lambda t: t.detach().clone(), reuse_buffer=False,
                flat_slots=False):
    """A ring all-gather with knobs: what goes in the own slot, one receive
    buffer for every step, slots left flat. Buffers are contiguous (a
    non-contiguous input is sent as a contiguous copy)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    shape = (tensor.numel(),) if flat_slots else tensor.shape
    out = [None] * world
    out[rank] = own(tensor).reshape(shape)
    buffer = torch.empty(shape, dtype=tensor.dtype)
    for step in range(world - 1):
        incoming = buffer if reuse_buffer else torch.empty(shape, dtype=tensor.dtype)
        works = [dist.isend(out[(rank - step) % world].contiguous(), (rank + 1) % world),
                 dist.irecv(incoming, (rank - 1) % world)]
        for work in works:
            work.wait()
        out[(rank - step - 1) % world] = incoming
    return out


def uses_all_gather(tensor):
    out = [torch.empty_like(tensor.detach()) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor.detach())
    return out


def test_a_hand_written_gather_ring_passes(capsys):
    assert check("all_gather_p2p", gather_ring, capsys)[0]


def plain_line_fit(sizes, times, p):
    slope, intercept = np.polyfit(sizes, times, 1)
    return intercept, slope  # fits t = alpha + n beta: the ring's factors lost


def ring_columns(sizes, p):
    sizes = np.asarray(sizes, float)
    return np.column_stack([np.full_like(sizes, 2 * (p - 1)), 2 * (p - 1) / p * sizes])


def unweighted_fit(sizes, times, p):
    """Right on exact data; on noisy times the largest messages decide."""
    alpha, beta = np.linalg.lstsq(ring_columns(sizes, p), np.asarray(times),
                                  rcond=None)[0]
    return float(alpha), float(beta)


def fitted_for_two_ranks(sizes, times, p):
    return unweighted_fit(sizes, times, 2)


def in_microseconds(sizes, times, p):
    alpha, beta = unweighted_fit(sizes, times, p)
    return alpha * 1e6, beta * 1e6


def whole_lstsq_result(sizes, times, p):
    return np.linalg.lstsq(ring_columns(sizes, p), np.asarray(times), rcond=None)


def relative_fit(sizes, times, p):
    """The fit the exercise asks for, written as a learner would."""
    times = np.asarray(times, float)
    design = ring_columns(sizes, p) / times[:, None]
    alpha, beta = np.linalg.lstsq(design, np.ones_like(times), rcond=None)[0]
    return float(alpha), float(beta)


def normal_equations_fit(sizes, times, p):
    """Right, in another style: the weighted normal equations solved with
    np.linalg.solve, returned as a numpy array."""
    n, t = np.asarray(sizes, float), np.asarray(times, float)
    columns = np.stack([np.full_like(n, 2.0 * (p - 1)), 2.0 * (p - 1) / p * n], axis=1)
    w = 1.0 / t ** 2  # the squared relative error's weight
    return np.linalg.solve(columns.T @ (columns * w[:, None]), columns.T @ (t * w))


def test_a_fit_by_the_normal_equations_passes(capsys):
    assert check("fit_alpha_beta", normal_equations_fit, capsys)[0]


def fit_weighted_by_the_time_squared(sizes, times, p):
    """Each row divided by its time twice: not "unweighted"."""
    from ddp_teach.exercises.nbA1_cost_models import weighted_fit
    return weighted_fit(sizes, np.asarray(times), p, 2)


def test_a_relative_least_squares_fit_passes(capsys):
    assert check("fit_alpha_beta", relative_fit, capsys)[0]


def test_hint_solution_and_unknown_names(capsys):
    ex.hint("ring_allreduce")
    assert "Hint 1:" in capsys.readouterr().out
    ex.solution("fit_alpha_beta")
    shown = capsys.readouterr().out
    assert "def fit_alpha_beta" in shown and "def link_as_pair" in shown
    assert ex.solution_cell("ring_allreduce") == (
        "from ddp_teach.collectives import ring_allreduce as my_ring_allreduce")
    assert ex.solution_cell("fit_alpha_beta") == (
        "from ddp_teach.exercises import reference_solution\n"
        "my_fit_alpha_beta = reference_solution('fit_alpha_beta')")
    with pytest.raises(KeyError, match="the exercises are"):
        ex.check("no_such_exercise", stub)
    assert not ex.check("fit_alpha_beta", 42)


def always_sends(tensor):
    dist.send(tensor, dst=(dist.get_rank() + 1) % dist.get_world_size())


def test_a_ring_of_any_shape_in_another_style_passes(capsys):
    """Right, in another style: chunks as index ranges of a contiguous
    copy, blocking send/recv ordered by parity, the result copied back."""
    def parity_ring(tensor):
        world, rank = dist.get_world_size(), dist.get_rank()
        work = tensor.detach().contiguous().view(-1).clone()
        bounds = [len(c) for c in torch.arange(work.numel()).tensor_split(world)]
        starts = [sum(bounds[:i]) for i in range(world)]
        piece = lambda i: work[starts[i]:starts[i] + bounds[i]]  # noqa: E731

        def exchange(send_i, recv_i):
            incoming = torch.empty_like(piece(recv_i))
            if rank % 2 == 0:
                dist.send(piece(send_i).clone(), (rank + 1) % world)
                dist.recv(incoming, (rank - 1) % world)
            else:
                dist.recv(incoming, (rank - 1) % world)
                dist.send(piece(send_i).clone(), (rank + 1) % world)
            return incoming
        for step in range(world - 1):
            piece((rank - step - 1) % world).add_(
                exchange((rank - step) % world, (rank - step - 1) % world))
        for step in range(world - 1):
            s, r = (rank + 1 - step) % world, (rank - step) % world
            piece(r).copy_(exchange(s, r))
        tensor.detach().copy_(work.view_as(tensor))
    assert check("ring_allreduce", parity_ring, capsys)[0]


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("ring_allreduce", averaged, ("you averaged", "expected")),
    ("ring_allreduce", without_own_data, ("missing this rank's own data", "expected")),
    ("ring_allreduce", lambda t: ring(t, all_gather_shift=-1),
     ("an index off by one", "expected")),
    ("ring_allreduce", not_in_place, ("the tensor did not change", "expected")),
    ("ring_allreduce", lambda t: ring(t, blocking=True),
     ("a deadlock", "rank 0 in send()", "isend")),
    ("ring_allreduce", lambda t: t.no_such_method(), ("AttributeError", "no_such_method")),
    ("ring_allreduce", always_sends, "return early when world_size == 1"),
    ("ring_allreduce", lambda t: ring(t, read_early=True),
     ("read before its wait() returned", "expected")),
    ("all_gather_p2p", gather_by_step, "index the list by the rank the tensor came FROM"),
    ("all_gather_p2p", gather_without_own, "put your own tensor at index rank"),
    ("all_gather_p2p", lambda t: t, "return a list of"),
    ("fit_alpha_beta", lambda s, t, p: ex.reference_solution("fit_alpha_beta")(s, t, p)[::-1],
     "return (alpha, beta), in that order"),
    ("fit_alpha_beta", plain_line_fit, "t = 2(p-1) alpha + 2(p-1)/p n beta"),
    ("fit_alpha_beta", lambda s, t, p: (1.0, 1.0), "np.linalg.lstsq"),
    # the second attempt's mistakes
    ("ring_allreduce", lambda t: ring(t, split=lambda flat, p: flat.chunk(p)),
     ("IndexError", "a 0-d float32 tensor", "tensor_split(p) always gives p")),
    ("ring_allreduce", whole_tensor_ring, ("sent and received", "not the whole tensor")),
    ("ring_allreduce", uses_all_reduce, ("called dist.all_reduce", "point-to-point")),
    ("ring_allreduce", lambda t: ring(t, detach=False),
     ("that requires grad", "tensor.detach()")),
    ("all_gather_p2p", lambda t: gather_ring(t, own=lambda x: x),
     "your input tensor itself"),
    ("all_gather_p2p", lambda t: gather_ring(t, own=lambda x: x.clone()),
     ("autograd history", "tensor.detach().clone()")),
    ("all_gather_p2p", lambda t: gather_ring(t, reuse_buffer=True),
     ("two slots of the list are one buffer", "a buffer of its own")),
    ("all_gather_p2p", uses_all_gather, "called dist.all_gather"),
    ("fit_alpha_beta", unweighted_fit, ("a few percent of noise", "Divide each row")),
    ("fit_alpha_beta", fitted_for_two_ranks, "use the p you are given"),
    ("fit_alpha_beta", in_microseconds, "not microseconds"),
    ("fit_alpha_beta", whole_lstsq_result, "np.linalg.lstsq's whole result"),
    # tried as a learner would (issue 34)
    ("ring_allreduce", lambda t: ring(t, copy_back=False),
     ("non-contiguous 3 x 4", "returns a COPY", "tensor.copy_(flat.view_as(tensor))")),
    ("all_gather_p2p", lambda t: gather_ring(t, flat_slots=True),
     ("each slot has shape", "the input's shape")),
    ("fit_alpha_beta", fit_weighted_by_the_time_squared,
     ("divided by its time squared", "once")),
]
