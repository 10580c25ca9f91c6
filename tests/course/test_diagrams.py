"""`ddp_teach.diagrams`: layout() states torch.distributed's rules, checked by
hand on 2 and 4 ranks and against the real collectives; draw() draws them."""
import pytest
from matplotlib.figure import Figure

import ddp_teach as dt
from ddp_teach import diagrams
from ddp_teach.diagrams import layout

ALL = ["a0", "a1", "a2", "a3"], ["b0", "b1", "b2", "b3"], \
      ["c0", "c1", "c2", "c3"], ["d0", "d1", "d2", "d3"]
SUMS = ["Σ0", "Σ1", "Σ2", "Σ3"]

EXPECTED = {
    ("broadcast", 2): ([["a0", "a1"], ["", ""]], [["a0", "a1"], ["a0", "a1"]]),
    ("broadcast", 4): ([ALL[0]] + [[""] * 4] * 3, [ALL[0]] * 4),
    ("reduce", 2): ([["a0", "a1"], ["b0", "b1"]], [["Σ0", "Σ1"], ["?", "?"]]),
    ("reduce", 4): (list(ALL), [SUMS] + [["?"] * 4] * 3),
    ("all_reduce", 2): ([["a0", "a1"], ["b0", "b1"]], [["Σ0", "Σ1"]] * 2),
    ("all_reduce", 4): (list(ALL), [SUMS] * 4),
    ("scatter", 2): ([["a0", "a1"], [""]], [["a0"], ["a1"]]),
    ("scatter", 4): ([ALL[0], [""], [""], [""]], [["a0"], ["a1"], ["a2"], ["a3"]]),
    ("gather", 2): ([["a0"], ["b0"]], [["a0", "b0"], ["b0"]]),
    ("gather", 4): ([["a0"], ["b0"], ["c0"], ["d0"]],
                    [["a0", "b0", "c0", "d0"], ["b0"], ["c0"], ["d0"]]),
    ("all_gather", 2): ([["a0"], ["b0"]], [["a0", "b0"]] * 2),
    ("all_gather", 4): ([["a0"], ["b0"], ["c0"], ["d0"]],
                        [["a0", "b0", "c0", "d0"]] * 4),
    ("reduce_scatter", 2): ([["a0", "a1"], ["b0", "b1"]], [["Σ0"], ["Σ1"]]),
    ("reduce_scatter", 4): (list(ALL), [["Σ0"], ["Σ1"], ["Σ2"], ["Σ3"]]),
    ("all_to_all", 2): ([["a0", "a1"], ["b0", "b1"]], [["a0", "b0"], ["a1", "b1"]]),
    ("all_to_all", 4): (list(ALL), [["a0", "b0", "c0", "d0"], ["a1", "b1", "c1", "d1"],
                                    ["a2", "b2", "c2", "d2"], ["a3", "b3", "c3", "d3"]]),
    ("send_recv", 2): ([["a0", "a1"], ["", ""]], [["a0", "a1"], ["a0", "a1"]]),
    ("send_recv", 4): ([ALL[0], [""] * 4, [], []], [ALL[0], ALL[0], [], []]),
}


def test_every_op_has_a_hand_checked_layout():
    assert {op for op, _ in EXPECTED} == set(diagrams.OPS)


@pytest.mark.parametrize("op, world_size", sorted(EXPECTED))
def test_layout_matches_torch_semantics(op, world_size):
    before, after = layout(op, world_size)
    assert (before, after) == EXPECTED[op, world_size]


def test_layout_rows_are_independent_lists():
    _, after = layout("all_reduce", 4)
    after[0].append("x")
    assert after[1] == SUMS


def _decode(rows, world_size):
    """Labels of a (chunks, 2) tensor of (bitmask of origin ranks, sum of
    chunk indices): one origin -> "b2", every rank -> "Σ2", zeros -> "",
    some ranks -> "partial"."""
    labels = []
    for mask, index in rows.tolist():
        origins = [r for r in range(world_size) if int(mask) >> r & 1]
        if not origins:
            labels.append("")
        elif len(origins) == 1:
            labels.append(f"{'abcdefgh'[origins[0]]}{int(index)}")
        elif len(origins) == world_size:
            labels.append(f"Σ{int(index) // world_size}")
        else:
            labels.append("partial")
    return labels


def _observe(rank, world_size):
    """In each worker: run every op on tensors that encode (origin, chunk);
    return {op: (labels before, labels after)} for this rank."""
    import torch
    import torch.distributed as dist
    p = world_size

    def chunks(origin, n=p):  # chunk k of rank `origin` is (2**origin, k)
        return torch.tensor([[2.0 ** origin, k] for k in range(n)])

    def empty(n=p):
        return torch.zeros(n, 2)

    seen = {}
    t = chunks(0) if rank == 0 else empty()
    before = _decode(t, p)
    dist.broadcast(t, src=0)
    seen["broadcast"] = before, _decode(t, p)
    for op, call in (("reduce", lambda t: dist.reduce(t, dst=0)),
                     ("all_reduce", dist.all_reduce)):
        t = chunks(rank)
        before = _decode(t, p)
        call(t)
        seen[op] = before, _decode(t, p)
    out = empty(1)
    pieces = list(chunks(0).split(1)) if rank == 0 else None
    before = _decode(torch.cat(pieces), p) if rank == 0 else _decode(out, p)
    dist.scatter(out, pieces, src=0)
    seen["scatter"] = before, _decode(out, p)
    mine = chunks(rank, 1)
    gathered = [empty(1) for _ in range(p)] if rank == 0 else None
    dist.gather(mine, gathered, dst=0)
    seen["gather"] = _decode(mine, p), _decode(
        torch.cat(gathered) if rank == 0 else mine, p)
    gathered = [empty(1) for _ in range(p)]
    dist.all_gather(gathered, mine)
    seen["all_gather"] = _decode(mine, p), _decode(torch.cat(gathered), p)
    out = empty(1)
    dist.reduce_scatter(out, list(chunks(rank).split(1)))
    seen["reduce_scatter"] = _decode(chunks(rank), p), _decode(out, p)
    out = empty()
    dist.all_to_all_single(out, chunks(rank))
    seen["all_to_all"] = _decode(chunks(rank), p), _decode(out, p)
    t = chunks(0) if rank == 0 else empty() if rank == 1 else None
    before = [] if t is None else _decode(t, p)
    if rank == 0:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=0)
    seen["send_recv"] = before, [] if t is None else _decode(t, p)
    return seen


@pytest.mark.parametrize("world_size", [2, 4])
def test_layout_matches_the_real_collectives(world_size):
    observed = dt.run(_observe, world_size)
    for op in diagrams.OPS:
        before, after = layout(op, world_size)
        for rank in range(world_size):
            seen_before, seen_after = observed[rank][op]
            assert seen_before == before[rank], (op, rank)
            if after[rank] == ["?"] * len(after[rank]):  # unspecified by torch
                assert len(seen_after) == len(after[rank]), (op, rank)
            else:
                assert seen_after == after[rank], (op, rank)


@pytest.mark.parametrize("op", diagrams.OPS)
def test_draw_returns_a_figure_for_every_op(op):
    fig = diagrams.draw(op)
    assert isinstance(fig, Figure)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "before" in texts and "after" in texts
    assert {f"rank {r}" for r in range(4)} <= {t.split(" (")[0] for t in texts}
    assert op in fig.axes[0].get_title(loc="left")


def test_rooted_ops_mark_the_root():
    texts = [t.get_text() for t in diagrams.draw("scatter").axes[0].texts]
    assert "rank 0 (src)" in texts
    texts = [t.get_text() for t in diagrams.draw("gather", 2).axes[0].texts]
    assert "rank 0 (dst)" in texts


def test_draw_all_has_one_panel_per_op():
    fig = diagrams.draw_all(2)
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_title(loc="left")]
    assert [t.split(":")[0] for t in titles] == list(diagrams.OPS)


def test_unknown_op_lists_the_supported_ones():
    with pytest.raises(ValueError, match="supported: broadcast, reduce"):
        diagrams.draw("all_reduce_coalesced")
    with pytest.raises(ValueError, match="all_to_all"):
        layout("barrier", 4)


@pytest.mark.parametrize("world_size", [1, 9, 2.0, True])
def test_world_size_must_be_drawable(world_size):
    with pytest.raises(ValueError, match="world_size"):
        layout("all_reduce", world_size)
