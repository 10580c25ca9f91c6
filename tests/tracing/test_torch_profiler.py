"""Timeline.from_torch_profiler: torch.profiler's Chrome traces read as the
course's timeline. The gloo path is tested on traces recorded here by a real
2-rank DDP run; the GPU path on the hand-made two-rank traces in
tests/tracing/data and on a one-rank NCCL trace recorded on an H200 (see the
README there: the hand-made ones are checked against the recorded one)."""
import gzip
import io
import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import ddp_teach as dt
from ddp_teach.tracing import drawing
from ddp_teach.tracing.events import COMM, COMPUTE
from ddp_teach.tracing.profiler_events import ELEMENT_BYTES
from ddp_teach.tracing.torch_profiler import NO_BYTES

DATA = Path(__file__).parent / "data"
STEPS, WIDTH, DEPTH = 3, 256, 4
US = 1e-6
# The reader subtracts the large timestamps (microseconds since boot) before
# scaling to seconds, so times read back carry only float64 rounding of sums
# of a few hundred sub-second times (ulp 2e-16 s each): far below 1e-12 s.
# The hand-made traces' times are whole microseconds.
EXACT = 1e-12


def profiled_ddp(rank, world_size, outdir):
    """A learner's DDP loop under torch.profiler, one trace per rank."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.3)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    torch.manual_seed(rank)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(STEPS):
            ddp(torch.randn(32, WIDTH)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    prof.export_chrome_trace(f"{outdir}/rank{rank}.json")
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(directory of the two ranks' traces, the model's gradient bytes)."""
    outdir = tmp_path_factory.mktemp("traces")
    gradient_bytes = dt.run(profiled_ddp, 2, args=(str(outdir),))
    assert gradient_bytes[0] == gradient_bytes[1] == DEPTH * (WIDTH + 1) * WIDTH * 4
    return outdir, gradient_bytes[0]


def rewrite(source: Path, target: Path, change) -> Path:
    trace = json.loads(source.read_text())
    change(trace)
    target.write_text(json.dumps(trace))
    return target


# ---- gloo, recorded here -----------------------------------------------------

def test_both_ranks_all_reduce_the_models_gradient_bytes_every_step(recorded):
    outdir, gradient_bytes = recorded
    timeline = dt.Timeline.from_torch_profiler(outdir)
    assert timeline.ranks == [0, 1]
    for rank in timeline.ranks:
        comm = timeline.filter(kind=COMM, rank=rank).events
        assert {e.name for e in comm} <= {"gloo:all_reduce", "gloo:broadcast"}
        all_reduced = sum(e.nbytes for e in comm if e.name == "gloo:all_reduce")
        assert all_reduced == STEPS * gradient_bytes  # each gradient once a step


def test_compute_is_named_by_phase_and_overlap_is_a_fraction(recorded):
    timeline = dt.Timeline.from_torch_profiler(recorded[0])
    compute = timeline.filter(kind=COMPUTE)
    assert {"forward", "backward", "optimizer"} <= drawing.phases(compute.events)
    assert not any(e.name.startswith(("c10d::", "gloo:")) for e in compute)
    for rank, row in timeline.summary().items():
        assert row["comm_s"] > 0 and row["compute_s"] > 0
        assert 0.0 <= timeline.overlap()[rank] <= 1.0
        assert 0.0 <= row["exposed_comm_s"] <= row["comm_s"]


def test_ranks_come_from_the_traces_not_the_order_given(recorded):
    outdir = recorded[0]
    in_order = dt.Timeline.from_torch_profiler([outdir / "rank0.json", outdir / "rank1.json"])
    reversed_ = dt.Timeline.from_torch_profiler([outdir / "rank1.json", outdir / "rank0.json"])
    by_glob = dt.Timeline.from_torch_profiler(str(outdir / "rank*.json"))
    assert in_order.events == reversed_.events == by_glob.events


def test_alignments_put_ranks_on_one_clock(recorded):
    outdir = recorded[0]
    collective = dt.Timeline.from_torch_profiler(outdir, align="collective")
    first_ends = [collective.filter(kind=COMM, rank=r).events[0].end for r in (0, 1)]
    assert first_ends[0] == pytest.approx(first_ends[1], abs=EXACT)
    start = dt.Timeline.from_torch_profiler(outdir, align="start")
    assert [start.for_rank(r).events[0].start for r in (0, 1)] == [0.0, 0.0]
    clock = dt.Timeline.from_torch_profiler(outdir, align="clock")
    firsts = []  # each rank's first gloo span: (base ns, ts us)
    for rank in (0, 1):
        trace = json.loads((outdir / f"rank{rank}.json").read_text())
        firsts.append((trace["baseTimeNanoseconds"], min(
            e["ts"] for e in trace["traceEvents"]
            if e.get("ph") == "X" and e["name"].startswith("gloo:"))))
    (base0, ts0), (base1, ts1) = firsts
    starts = [clock.filter(kind=COMM, rank=r).events[0].start for r in (0, 1)]
    # the files give microseconds to the nanosecond
    assert starts[1] - starts[0] == pytest.approx(
        ((base1 - base0) / 1e3 + ts1 - ts0) * US, abs=1e-9)
    for timeline in (start, clock):  # the numbers are per rank: alignment keeps them
        for rank, row in timeline.summary().items():
            for key in ("compute_s", "comm_s", "overlap_s", "span_s"):
                assert row[key] == pytest.approx(collective.summary()[rank][key], abs=EXACT)


def test_plot_compare_and_chrome_round_trip_work_on_a_profiler_timeline(recorded, tmp_path):
    timeline = dt.Timeline.from_torch_profiler(recorded[0])
    for figure in (timeline.plot(), dt.Timeline.compare(
            timeline, dt.Timeline.from_torch_profiler(DATA), labels=("gloo", "nccl"))):
        png = io.BytesIO()
        figure.savefig(png, format="png")
        assert png.getvalue().startswith(b"\x89PNG")
    timeline.to_chrome_trace(tmp_path / "course.json")
    again = dt.Timeline.from_chrome_trace(tmp_path / "course.json")
    assert [(e.name, e.nbytes) for e in again] == [(e.name, e.nbytes) for e in timeline]


def test_a_trace_without_shapes_reads_zero_bytes_and_says_how_to_get_them(recorded, tmp_path):
    def drop_shapes(trace):
        for e in trace["traceEvents"]:
            for key in ("Input Dims", "Input type"):
                e.get("args", {}).pop(key, None)
    paths = [rewrite(recorded[0] / f"rank{r}.json", tmp_path / f"rank{r}.json", drop_shapes)
             for r in (0, 1)]
    with pytest.warns(UserWarning, match="record_shapes=True") as caught:
        timeline = dt.Timeline.from_torch_profiler(paths)
    assert str(caught[0].message) == NO_BYTES
    assert timeline.filter(kind=COMM).events and not any(e.nbytes for e in timeline)


def test_a_gzipped_trace_reads_like_the_plain_one(recorded, tmp_path):
    for rank in (0, 1):
        with gzip.open(tmp_path / f"rank{rank}.json.gz", "wt") as f:
            f.write((recorded[0] / f"rank{rank}.json").read_text())
    assert (dt.Timeline.from_torch_profiler(tmp_path).events
            == dt.Timeline.from_torch_profiler(recorded[0]).events)


# ---- bad input ---------------------------------------------------------------

def test_bad_files_get_errors_that_say_what_is_wrong(recorded, tmp_path):
    (tmp_path / "notes.json").write_text("rank 0 was slow")
    with pytest.raises(ValueError, match="not a Chrome trace .not JSON"):
        dt.Timeline.from_torch_profiler([tmp_path / "notes.json"])
    (tmp_path / "other.json").write_text('{"loss": [3.1, 2.7]}')
    with pytest.raises(ValueError, match="no 'traceEvents' list"):
        dt.Timeline.from_torch_profiler([tmp_path / "other.json"])
    (tmp_path / "empty.json").write_text('{"traceEvents": []}')
    with pytest.raises(ValueError, match="empty trace"):
        dt.Timeline.from_torch_profiler([tmp_path / "empty.json"])

    def drop_collectives(trace):
        trace["traceEvents"] = [e for e in trace["traceEvents"]
                                if not e.get("name", "").startswith("gloo:")]
    silent = rewrite(recorded[0] / "rank0.json", tmp_path / "silent.json", drop_collectives)
    with pytest.raises(ValueError, match="holds no communication.*DDP's backward"):
        dt.Timeline.from_torch_profiler([silent])

    def host_only(trace):  # a GPU run profiled without ProfilerActivity.CUDA
        trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("pid") != 0]
    cpu_side = rewrite(DATA / "gpu_rank0.json", tmp_path / "cpu_side.json", host_only)
    with pytest.raises(ValueError, match="kernels are missing.*ProfilerActivity.CUDA"):
        dt.Timeline.from_torch_profiler([cpu_side])


def test_bad_arguments_get_errors_that_say_what_to_do(recorded, tmp_path):
    rank0 = recorded[0] / "rank0.json"
    with pytest.raises(ValueError, match="2 traces say they are rank 0"):
        dt.Timeline.from_torch_profiler([rank0, rank0])
    with pytest.raises(FileNotFoundError, match="no trace files at"):
        dt.Timeline.from_torch_profiler(str(tmp_path / "rank*.json"))
    with pytest.raises(FileNotFoundError, match="is not a file"):
        dt.Timeline.from_torch_profiler([tmp_path / "missing.json"])
    with pytest.raises(ValueError, match="no trace files given"):
        dt.Timeline.from_torch_profiler([])
    with pytest.raises(ValueError, match="choose one of"):
        dt.Timeline.from_torch_profiler(recorded[0], align="ntp")


def test_time_inside_a_communication_call_is_not_compute(tmp_path):
    """A backward function that calls an all-reduce and waits 30 us inside it:
    the wait is cut out of its compute (a small trace in Kineto's CPU form)."""
    def x(cat, name, tid, ts, dur):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid,
                "ts": 1000.0 + ts, "dur": dur, "args": {}}
    trace = {"baseTimeNanoseconds": 0, "traceEvents": [
        x("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 1, 0, 100),
        x("cpu_op", "aten::mm", 1, 10, 20),
        x("cpu_op", "c10d::allreduce_", 1, 40, 30),
        x("user_annotation", "gloo:all_reduce", 2, 45, 20)]}
    (tmp_path / "t.json").write_text(json.dumps(trace))
    with pytest.warns(UserWarning, match="record_shapes"):
        timeline = dt.Timeline.from_torch_profiler([tmp_path / "t.json"])
    compute = [(e.name, e.start / US, e.end / US) for e in timeline.filter(kind=COMPUTE)]
    assert compute == [("backward AddmmBackward0", 0, 40), ("backward AddmmBackward0", 70, 100)]
    assert timeline.summary()[0]["overlap_s"] == 0.0  # the rank waited, it did not compute


def test_element_sizes_match_torch_under_both_names_a_trace_uses(tmp_path):
    """"Input type" spells a dtype as C++ does (profiled here); record_param_comms'
    "dtype" as c10's ScalarType, which is what torch.Tensor.type() prints."""
    dtypes = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
              torch.float16, torch.float32, torch.float64, torch.complex64,
              torch.complex128, torch.bool, torch.bfloat16, torch.float8_e5m2,
              torch.float8_e4m3fn, torch.uint16, torch.uint32, torch.uint64]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for dtype in dtypes:
            torch.empty(2, dtype=dtype).clone()
    prof.export_chrome_trace(str(tmp_path / "clones.json"))
    clones = [e for e in json.loads((tmp_path / "clones.json").read_text())["traceEvents"]
              if e.get("name") == "aten::clone"]
    cpp_names = [e["args"]["Input type"][0] for e in sorted(clones, key=lambda e: e["ts"])]
    scalar_names = [torch.empty(0, dtype=d).type().removeprefix("torch.").removesuffix("Tensor")
                    for d in dtypes]
    assert len(cpp_names) == len(dtypes)
    for names in (cpp_names, scalar_names):
        assert {name: ELEMENT_BYTES.get(name) for name in names} == {
            name: dtype.itemsize for name, dtype in zip(names, dtypes)}


# ---- GPU: the hand-made Kineto traces in tests/tracing/data ---------------------

def test_gpu_traces_nccl_kernels_communicate_and_other_kernels_compute():
    """The fixture (data/README.md) holds per rank two NCCL all-reduces of
    131,584 floats on stream 13 and six other kernels; the memcpy, the CPU
    operators and the launches are no part of either lane."""
    timeline = dt.Timeline.from_torch_profiler(DATA)
    assert timeline.ranks == [0, 1]
    for rank in (0, 1):
        comm = timeline.filter(kind=COMM, rank=rank).events
        assert [(e.name, e.nbytes) for e in comm] == [("nccl:allreduce", 131584 * 4)] * 2
        names = [e.name for e in timeline.filter(kind=COMPUTE, rank=rank)]
        assert names == ["vectorized_elementwise_kernel", "forward aten::addmm",
                         "backward aten::mm", "backward aten::mm", "backward aten::mm",
                         "optimizer aten::_foreach_add_"]


def test_gpu_overlap_and_exposed_communication_are_those_worked_out_by_hand():
    """Rank 0: bucket 0 runs 310-470 us beside compute until 455 (145 us
    hidden), bucket 1 470-520 alone: 210 us of communication, 65 exposed.
    Rank 1: bucket 0 330-470 all under compute until 475 (140 us), bucket 1
    475-520 alone: 185 us, 45 exposed."""
    summary = dt.Timeline.from_torch_profiler(DATA).summary()
    expected = {0: (210, 145, 65), 1: (185, 140, 45)}
    for rank, (comm_us, overlap_us, exposed_us) in expected.items():
        row = summary[rank]
        assert row["comm_s"] == pytest.approx(comm_us * US, abs=EXACT)
        assert row["overlap_s"] == pytest.approx(overlap_us * US, abs=EXACT)
        assert row["exposed_comm_s"] == pytest.approx(exposed_us * US, abs=EXACT)


def test_gpu_ranks_on_one_clock_despite_a_skewed_one():
    """Rank 1's clock reads 2,500 us ahead: trusted ("clock"), its first
    all-reduce ends that much later; aligned on it ("collective"), together."""
    def first_comm_ends(align):
        timeline = dt.Timeline.from_torch_profiler(DATA, align=align)
        return [timeline.filter(kind=COMM, rank=r).events[0].end for r in (0, 1)]
    together = first_comm_ends("collective")
    assert together[1] - together[0] == pytest.approx(0, abs=EXACT)
    skewed = first_comm_ends("clock")
    assert skewed[1] - skewed[0] == pytest.approx(2500 * US, abs=EXACT)


# A trace recorded on a real GPU by tools/record_gpu_trace.py (data/README.md):
# one rank of DDP over NCCL on an H200, torch 2.11, NCCL 2.28.9.
REAL_ONE_RANK = DATA / "recorded" / "h200_one_rank_nccl_ddp.json.gz"


def real_trace() -> dict:
    with gzip.open(REAL_ONE_RANK, "rt") as f:
        return json.load(f)


def test_a_real_one_rank_nccl_trace_is_compute_only_and_says_why():
    """NCCL launched no kernel for its group of one (the all-reduces became
    device-to-device copies), so every event is a compute kernel, named
    after the operator that launched it and its phase; the warning says why
    there is no communication instead of blaming the profiler's settings."""
    trace = real_trace()
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and not any(k["name"].startswith("nccl") for k in kernels)
    with pytest.warns(UserWarning, match="one-rank run: NCCL launches no communication"):
        timeline = dt.Timeline.from_torch_profiler(REAL_ONE_RANK)
    assert timeline.ranks == [0]
    assert {e.kind for e in timeline.events} == {COMPUTE}
    assert len(timeline.events) == len(kernels)
    names = {e.name for e in timeline.events}
    # the 2 profiled steps: DDP's forward (addmm per Linear), the autograd
    # engine's backward (mm), SGD's foreach step, each under its phase
    assert {"forward aten::addmm", "backward aten::mm",
            "optimizer aten::_foreach_add_"} <= names
    summary = timeline.summary()[0]
    assert summary["comm_s"] == 0 and summary["overlap_s"] == 0
    assert 0 < summary["compute_s"] < summary["span_s"]


def test_the_hand_made_gpu_traces_use_the_fields_of_a_real_one():
    """Every field the reader takes from a GPU trace, in the hand-made
    fixtures, is in the real trace too, with a value of the same type; the
    real collective's dtype is one the reader sizes."""
    real = real_trace()
    made = json.loads((DATA / "gpu_rank0.json").read_text())
    assert {"rank", "world_size", "backend"} <= set(real["distributedInfo"])
    assert isinstance(real["baseTimeNanoseconds"], int)

    def first(trace, has, cats=("kernel", "cpu_op")):
        return next(e for e in trace["traceEvents"]
                    if e.get("cat") in cats and has in e.get("args", {}))
    # a launched kernel's fields; a collective's (Kineto copies them from its
    # record_param_comms op onto the NCCL kernel: the fixtures carry them there)
    for has, cats, keys in (
            ("External id", ("kernel",), ("External id", "device", "stream", "correlation")),
            ("Collective name", ("kernel", "cpu_op"), ("Collective name", "In msg nelems", "dtype"))):
        real_event, made_event = first(real, has, cats), first(made, has, cats)
        for key in keys:
            assert type(real_event["args"][key]) is type(made_event["args"][key]), (has, key)
        for key in ("ph", "pid", "tid", "ts", "dur"):
            assert type(real_event[key]) is type(made_event[key]) or {
                type(real_event[key]), type(made_event[key])} <= {int, float}, key
    assert first(real, "Collective name")["args"]["dtype"] in ELEMENT_BYTES


def test_communication_events_carry_the_courses_operation_and_whole_buffer(tmp_path):
    """As the course's own events: `op` from the collective's name whatever
    its spelling, and an all-gather's bytes its whole output (Kineto's
    "Out msg nelems"), not its shard."""
    from ddp_teach.tracing.profiler_events import collective_op
    assert [collective_op(n) for n in (
        "nccl:allreduce", "nccl:_allgather_base", "nccl:reduce_scatter_tensor_coalesced",
        "gloo:all_gather", "nccl:all_to_allv", "nccl:broadcast", "nccl:send",
        "gloo:reduce", "nccl:mystery")] == [
        "all_reduce", "all_gather", "reduce_scatter", "all_gather", "all_to_all",
        "broadcast", "send", "reduce", "nccl:mystery"]

    def gather(trace):  # the first bucket's all-reduce, made an all-gather of 4 shards
        for e in trace["traceEvents"]:
            if e.get("cat") == "kernel" and "Collective name" in e.get("args", {}):
                e["args"].update({"Collective name": "_allgather_base",
                                  "In msg nelems": 1000, "Out msg nelems": 4000})
                break
    for rank in (0, 1):
        rewrite(DATA / f"gpu_rank{rank}.json", tmp_path / f"rank{rank}.json", gather)
    comm = dt.Timeline.from_torch_profiler(tmp_path).filter(kind=COMM, rank=0).events
    assert [(e.op, e.nbytes) for e in comm] == [("all_gather", 4000 * 4),
                                               ("all_reduce", 131584 * 4)]
    assert comm[0].name == "nccl:_allgather_base"
