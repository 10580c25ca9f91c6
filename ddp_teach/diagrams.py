"""`ddp_teach.diagrams`: who sends what to whom, one small picture per collective.

Why: a collective is a rule about where data ends up, and the rule is easier
to read from a picture than from a signature. Each picture shows what every
rank holds before and after the call, as a row of blocks. A block's colour is
the rank the data came from and its label says which chunk it is: "b2" is
chunk 2 of rank 1's tensor (a, b, c, ... for ranks 0, 1, 2, ...), "Σ2" is the
sum of chunk 2 over all ranks (grey, with a stripe of every contributor's
colour). A dashed empty block is a buffer whose contents do not matter (the
call overwrites it); "?" marks contents torch leaves unspecified (after
`reduce`, gloo leaves partial sums on the ranks other than dst). Rooted ops
use rank 0 as src or dst, and send_recv sends from rank 0 to rank 1.

`layout(op, world_size)` is the rule as data (the labels each rank holds), so
that it can be checked against the real collectives; `draw(op)` draws it.
`barrier` has no picture: it moves no data, it only makes ranks wait.

`parameter_server_traffic(n)` draws who talks to whom in one step of
training before all-reduce (notebook 09, `ddp_teach.paramserver`): every
worker to and from one server, beside a ring all-reduce's neighbours.
"""
import math

from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Rectangle

RULES = {
    "broadcast": "rank 0 (src) sends its tensor; every rank ends with a copy",
    "reduce": "rank 0 (dst) ends with the sum of all ranks' tensors; the "
              "others' are left unspecified",
    "all_reduce": "every rank ends with the sum of all ranks' tensors",
    "scatter": "rank 0 (src) sends chunk r of its list to rank r",
    "gather": "rank 0 (dst) collects every rank's tensor, in rank order",
    "all_gather": "every rank ends with every rank's tensor, in rank order",
    "reduce_scatter": "rank r ends with chunk r of the sum of all ranks' tensors",
    "all_to_all": "rank r sends its chunk j to rank j, and so ends with "
                  "chunk r of every rank",
    "send_recv": "rank 0 sends its tensor to rank 1, whose recv overwrites "
                 "its buffer; the others take no part",
}
OPS = tuple(RULES)
ROLES = {"broadcast": {0: "src"}, "scatter": {0: "src"}, "reduce": {0: "dst"},
         "gather": {0: "dst"}, "send_recv": {0: "src", 1: "dst"}}
MAX_WORLD_SIZE = 8
LETTERS = "abcdefgh"
# tab10 without its grey (kept for reduced blocks) and its olive (pale under
# white text): one colour per origin rank.
COLOURS = [colormaps["tab10"].colors[i] for i in (0, 1, 2, 3, 4, 5, 6, 9)]
REDUCED, EMPTY, UNSPECIFIED = "0.4", "", "?"
# parameter_server_traffic's colours (gradients, parameters) and node size
GRAD_COLOUR, PARAM_COLOUR = "#e07b24", "#3b6fb6"
NODE_RADIUS = 0.28


def _check(op: str, world_size: int) -> None:
    if op not in RULES:
        raise ValueError(f"unknown op {op!r}; supported: {', '.join(OPS)}")
    if (isinstance(world_size, bool) or not isinstance(world_size, int)
            or not 2 <= world_size <= MAX_WORLD_SIZE):
        raise ValueError(f"world_size must be an int from 2 to "
                         f"{MAX_WORLD_SIZE}; got {world_size!r}")


def layout(op: str, world_size: int = 4) -> tuple[list, list]:
    """(before, after): for each rank, the labels of the blocks it holds.

    A whole tensor is world_size chunks; the ops that gather or scatter one
    chunk per rank (scatter, gather, all_gather, reduce_scatter's output)
    move single chunks. "" is a buffer about to be overwritten, "?" contents
    torch does not specify, and [] a rank that takes no part.
    """
    _check(op, world_size)
    ranks = range(world_size)

    def chunks(origin):  # a rank's whole tensor
        return [f"{LETTERS[origin]}{k}" for k in ranks]

    own = [chunks(r) for r in ranks]
    firsts = [[f"{LETTERS[r]}0"] for r in ranks]  # one chunk per rank
    summed = [f"Σ{k}" for k in ranks]
    if op == "broadcast":
        return ([chunks(0) if r == 0 else [EMPTY] * world_size for r in ranks],
                [chunks(0) for r in ranks])
    if op == "reduce":
        return own, [summed if r == 0 else [UNSPECIFIED] * world_size
                     for r in ranks]
    if op == "all_reduce":
        return own, [list(summed) for r in ranks]
    if op == "scatter":
        return ([chunks(0) if r == 0 else [EMPTY] for r in ranks],
                [[f"{LETTERS[0]}{r}"] for r in ranks])
    if op == "gather":
        return firsts, [[f"{LETTERS[s]}0" for s in ranks] if r == 0
                        else list(firsts[r]) for r in ranks]
    if op == "all_gather":
        return firsts, [[f"{LETTERS[s]}0" for s in ranks] for r in ranks]
    if op == "reduce_scatter":
        return own, [[f"Σ{r}"] for r in ranks]
    if op == "all_to_all":
        return own, [[f"{LETTERS[s]}{r}" for s in ranks] for r in ranks]
    # send_recv: rank 0 -> rank 1
    idle = world_size - 2
    return ([chunks(0), [EMPTY] * world_size] + [[] for _ in range(idle)],
            [chunks(0), chunks(0)] + [[] for _ in range(idle)])


def _block(ax, x, y, label, world_size, fontsize):
    """One block of width 1 centred on height y, its left edge at x."""
    w, h = 0.9, 0.78
    left, bottom = x + 0.05, y - h / 2
    text_colour = "white"
    if label == EMPTY:
        ax.add_patch(Rectangle((left, bottom), w, h, facecolor="white",
                               edgecolor="0.55", linestyle="--"))
        return
    if label == UNSPECIFIED:
        face, text_colour = "0.88", "0.3"
        ax.add_patch(Rectangle((left, bottom), w, h, facecolor=face,
                               edgecolor="0.6", hatch="///"))
    elif label.startswith("Σ"):
        ax.add_patch(Rectangle((left, bottom), w, h, facecolor=REDUCED,
                               edgecolor="white"))
        stripe = w / world_size  # every contributor's colour, along the foot
        for r in range(world_size):
            ax.add_patch(Rectangle((left + r * stripe, bottom), stripe, h * 0.2,
                                   facecolor=COLOURS[r], edgecolor="none"))
    else:
        ax.add_patch(Rectangle((left, bottom), w, h, edgecolor="white",
                               facecolor=COLOURS[LETTERS.index(label[0])]))
    ax.text(left + w / 2, y + (0.06 if label.startswith("Σ") else 0), label,
            ha="center", va="center", color=text_colour, fontsize=fontsize,
            fontweight="bold")


def _draw_on(ax, op: str, world_size: int) -> None:
    before, after = layout(op, world_size)
    roles = ROLES.get(op, {})
    gap = 1.6  # room for the arrow between the panels
    fontsize = 8 if world_size <= 4 else 6.5
    for x0, rows, title in ((0, before, "before"),
                            (world_size + gap, after, "after")):
        ax.text(x0 + world_size / 2, 0.75, title, ha="center", va="center",
                fontsize=9, fontstyle="italic", color="0.25")
        for r, labels in enumerate(rows):
            if not labels:
                ax.text(x0 + 0.1, -r, "takes no part", va="center",
                        fontsize=fontsize, color="0.55", fontstyle="italic")
            for k, label in enumerate(labels):
                _block(ax, x0 + k, -r, label, world_size, fontsize)
    for r in range(world_size):
        role = f" ({roles[r]})" if r in roles else ""
        ax.text(-0.15, -r, f"rank {r}{role}", ha="right", va="center",
                fontsize=fontsize + 0.5, fontweight="bold" if role else "normal")
    middle = -(world_size - 1) / 2
    ax.annotate("", xy=(world_size + gap - 0.3, middle),
                xytext=(world_size + 0.3, middle),
                arrowprops=dict(arrowstyle="-|>", lw=2, color="0.3"))
    ax.set_title(f"{op}: {RULES[op]}", fontsize=9, loc="left")
    ax.set_xlim(-2.1, 2 * world_size + gap + 0.05)
    ax.set_ylim(-world_size + 0.45, 1.05)
    ax.axis("off")


def _height(world_size: int) -> float:
    return 0.6 + 0.4 * world_size  # 2.2 inches for 4 ranks


def draw(op: str, world_size: int = 4) -> Figure:
    """A figure of what each rank holds before and after `op` (one of OPS)."""
    _check(op, world_size)
    fig = Figure(figsize=(7, _height(world_size)), layout="constrained")
    _draw_on(fig.add_subplot(), op, world_size)
    return fig


def draw_all(world_size: int = 4) -> Figure:
    """Every picture of OPS in one figure, two per row."""
    _check(OPS[0], world_size)
    rows = (len(OPS) + 1) // 2
    fig = Figure(figsize=(14, rows * _height(world_size)), layout="constrained")
    axes = fig.subplots(rows, 2).flat
    for op, ax in zip(OPS, axes):  # OPS first: zip stops before taking an axis
        _draw_on(ax, op, world_size)
    for ax in axes:  # the cells left over
        ax.axis("off")
    return fig


def parameter_server_traffic(num_workers: int = 4) -> Figure:
    """Who talks to whom in one step: a parameter server (every worker to
    and from one process) beside a ring all-reduce (each rank to the next)."""
    figure = Figure(figsize=(9, 3.4), layout="constrained")
    star, ring = figure.subplots(1, 2)
    server = (0.0, 1.3)
    _circle_node(star, server, "server")
    for i in range(num_workers):
        worker = (i - (num_workers - 1) / 2, 0.0)
        _circle_node(star, worker, f"worker{i + 1}")
        _traffic_arrow(star, worker, server, GRAD_COLOUR, offset=0.1)
        _traffic_arrow(star, server, worker, PARAM_COLOUR, offset=0.1)
    star.text(0, -0.45, "orange: gradients   blue: parameters", ha="center",
              fontsize=8, color="0.3")
    star.set_title(f"parameter server: its link carries 2 x {num_workers} "
                   "models\nper step (gradients in, parameters out)",
                   fontsize=10)
    points = [(math.cos(math.pi / 2 - 2 * math.pi * i / num_workers),
               math.sin(math.pi / 2 - 2 * math.pi * i / num_workers))
              for i in range(num_workers)]
    for i, point in enumerate(points):
        _circle_node(ring, point, f"rank {i}")
        _traffic_arrow(ring, point, points[(i + 1) % num_workers], GRAD_COLOUR)
    ring.set_title(f"ring all-reduce: each rank sends 2 x {num_workers - 1}"
                   f"/{num_workers}\nof a model per step, to its neighbour",
                   fontsize=10)
    half = num_workers / 2 + 0.3
    star.set(xlim=(-half, half), ylim=(-0.6, 1.8))
    ring.set(xlim=(-1.6, 1.6), ylim=(-1.4, 1.4))
    for ax in (star, ring):
        ax.set_aspect("equal")
        ax.axis("off")
    return figure


def _circle_node(ax, centre, label):
    ax.add_patch(Circle(centre, NODE_RADIUS, color="0.9", ec="0.5"))
    ax.text(*centre, label, ha="center", va="center", fontsize=8)


def _traffic_arrow(ax, start, end, colour, offset=0.0):
    """An arrow from node to node, stopping at their rims, shifted sideways
    by `offset` (so that two arrows between the same nodes do not overlap)."""
    dx, dy = end[0] - start[0], end[1] - start[1]
    length = (dx * dx + dy * dy) ** 0.5
    ux, uy = dx / length, dy / length
    shift = (-uy * offset, ux * offset)
    tail = (start[0] + ux * NODE_RADIUS + shift[0], start[1] + uy * NODE_RADIUS + shift[1])
    head = (end[0] - ux * NODE_RADIUS + shift[0], end[1] - uy * NODE_RADIUS + shift[1])
    ax.annotate("", xy=head, xytext=tail,
                arrowprops=dict(arrowstyle="-|>", color=colour, lw=1.2))
