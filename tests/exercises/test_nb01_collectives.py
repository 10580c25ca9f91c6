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
         batched=False):
    """A ring all-reduce with knobs for three classic mistakes (and for
    batch_isend_irecv, which is right too)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = list(tensor.view(-1).tensor_split(world))
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


def test_the_reference_ring_allreduce_is_correct(capsys):
    from ddp_teach.collectives import ring_allreduce
    passed, seen = check("ring_allreduce", ring_allreduce, capsys)
    assert passed and "✅" in seen and "world sizes (1, 2, 3, 4)" in seen


def test_a_correct_hand_written_ring_passes(capsys):
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


def plain_line_fit(sizes, times, p):
    slope, intercept = np.polyfit(sizes, times, 1)
    return intercept, slope  # fits t = alpha + n beta: the ring's factors lost


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
]
