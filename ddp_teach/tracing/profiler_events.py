"""One rank's torch.profiler trace as compute and communication events.

What counts as what follows Meta's Holistic Trace Analysis (HTA,
"Communication Computation Overlap"):

- On a GPU (the trace holds `cat: "kernel"` events, Kineto's CUDA kernels):
  communication is the NCCL kernels (names starting `ncclKernel` or
  `ncclDevKernel`) on their stream, compute every other kernel; copies and
  memsets are neither. Kineto copies a collective's "Collective name",
  "In msg nelems" and "dtype" from its `record_param_comms` op onto the
  kernel (libkineto's output_json.cpp), which gives the bytes.
- On a CPU (gloo): communication is the `gloo:<collective>` spans that
  ProcessGroupGloo records on its worker threads (pt_gloo_runloop) while the
  collective runs; their "Input Dims" and "Input type" give the bytes, but
  only in a trace recorded with `record_shapes=True`. Compute is the outermost
  operator (`cat: "cpu_op"`) on every other thread, less the time spent inside
  a communication call there (`c10d::allreduce_` and kin), which is waiting.
  Python's own time between operators is not compute here.

A compute event is named after its phase when one encloses it: "backward"
inside the autograd engine's `evaluate_function`, "forward" inside a
`<Module>.forward` annotation (DDP's `DistributedDataParallel.forward`),
"optimizer" inside `Optimizer.step` / `zero_grad`; the timeline's drawing
colours those phases.

A communication event gets the course's `op` (`ddp_teach.tracing.operations`)
from its collective's name, and `nbytes` as the profiler recorded the
message: on a GPU the whole buffer, as the course's own events count it (an
all-gather's output, a reduce-scatter's input: the larger of Kineto's "In"
and "Out msg nelems"); with gloo the tensors its span lists as inputs (for
DDP's all-reduce, the bucket).
"""
import bisect
import re
import warnings

from ddp_teach.tracing.events import COMM, COMPUTE, Event

NCCL_KERNELS = ("ncclKernel", "ncclDevKernel")
# calls that hand work to a communication library; time inside them is waiting
COMM_CALLS = ("c10d::", "_c10d_functional::", "c10d_functional::",
              "record_param_comms", "gloo:", "nccl:")
# Element sizes under both names a trace uses: c10's ScalarType names (the
# "dtype" of record_param_comms, as torch.Tensor.type() spells it) and the C++
# type names of "Input type" (caffe2::TypeMeta). tests/tracing check both
# against the installed torch.
ELEMENT_BYTES = {
    "Byte": 1, "Char": 1, "Short": 2, "Int": 4, "Long": 8, "Half": 2, "Float": 4,
    "Double": 8, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16,
    "Bool": 1, "BFloat16": 2, "Float8_e5m2": 1, "Float8_e4m3fn": 1,
    "UInt16": 2, "UInt32": 4, "UInt64": 8,
    "unsigned char": 1, "signed char": 1, "short int": 2, "int": 4, "long int": 8,
    "c10::Half": 2, "float": 4, "double": 8, "c10::complex<c10::Half>": 4,
    "c10::complex<float>": 8, "c10::complex<double>": 16, "bool": 1,
    "c10::BFloat16": 2, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fn": 1,
    "short unsigned int": 2, "unsigned int": 4, "long unsigned int": 8,
}
US = 1e-6
# Seen in a real one-rank DDP trace on an H200 (torch 2.11, NCCL 2.28.9):
# NCCL ran no kernel for a group of one, only device-to-device copies.
ONE_RANK = ("{path!r} is a one-rank run: NCCL launches no communication kernel "
            "for a group of one rank (at most it copies the buffer), so this "
            "timeline is compute only; profile two or more ranks to see "
            "communication and overlap")


def rank_events(trace: dict, rank: int, path, shift_us: float) -> list[Event]:
    """One trace's compute and communication, in seconds from its `ts` plus
    `shift_us`: NCCL kernels or else gloo's spans communicate; kernels, where
    the trace has any, or else the CPU's operators compute."""
    spans = complete_spans(trace)
    kernels = [e for e in spans if e.get("cat") == "kernel"]
    nccl = [e for e in kernels if e["name"].startswith(NCCL_KERNELS)]
    found = list(_nccl_comm(nccl) if nccl else _gloo_comm(spans))
    if not found and trace.get("distributedInfo", {}).get("world_size") == 1:
        warnings.warn(ONE_RANK.format(path=str(path)), stacklevel=4)
    elif not found:
        hint = ("NCCL was called but its kernels are missing: profile with "
                "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]"
                if any(e["name"].startswith("nccl:") for e in spans) and not kernels
                else "profile steps in which the ranks communicate (DDP's backward), "
                "on every rank")
        raise ValueError(
            f"{str(path)!r} holds no communication: no NCCL kernel (ncclKernel*, "
            f"ncclDevKernel*) and no gloo collective (gloo:*); {hint}")
    found += _kernel_compute(spans, kernels) if kernels else _cpu_compute(spans)
    return [Event(rank, name, kind, (e["ts"] + shift_us) * US,
                  (e["ts"] + shift_us) * US + e["dur"] * US, nbytes,
                  op=collective_op(name) if kind == COMM else "")
            for name, kind, e, nbytes in found]


def complete_spans(trace: dict) -> list[dict]:
    """The complete events ("X") of a process or device (not Kineto's spans)."""
    return [e for e in trace["traceEvents"] if isinstance(e, dict)
            and e.get("ph") == "X" and isinstance(e.get("pid"), int)
            and isinstance(e.get("ts"), (int, float))
            and isinstance(e.get("dur"), (int, float))]


def _nccl_comm(kernels):
    for kernel in kernels:
        args = kernel.get("args", {})
        name = (f"nccl:{args['Collective name']}" if "Collective name" in args
                else _short_kernel(kernel["name"]))
        # the whole buffer, as the course's events count it: an all-gather's
        # output, a reduce-scatter's input (the larger of the two)
        nelems = max(int(args.get("In msg nelems", 0)), int(args.get("Out msg nelems", 0)))
        yield name, COMM, kernel, nelems * ELEMENT_BYTES.get(args.get("dtype"), 0)


# the operation of a collective as Kineto and gloo name it ("allreduce",
# "_allgather_base", "reduce_scatter_tensor_coalesced", "gloo:all_gather"),
# most specific first
_OPS = (("reducescatter", "reduce_scatter"), ("allgather", "all_gather"),
        ("allreduce", "all_reduce"), ("alltoall", "all_to_all"),
        ("broadcast", "broadcast"), ("barrier", "barrier"), ("send", "send"),
        ("recv", "recv"), ("reduce", "reduce"))


def collective_op(name: str) -> str:
    """The course's operation (`ddp_teach.tracing.operations`) of a
    communication event named `name` by a trace, or the name itself."""
    squeezed = name.split(":", 1)[-1].lower().replace("_", "")
    return next((op for key, op in _OPS if key in squeezed), name)


def _gloo_comm(spans):
    for e in spans:
        if e["name"].startswith("gloo:"):
            yield e["name"], COMM, e, _input_bytes(e.get("args", {}))


def _kernel_compute(spans, kernels) -> list:
    """The kernels that are not NCCL's, named after the operator that
    launched them (linked by "External id") and its phase."""
    ops = {e["args"]["External id"]: e for e in spans
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    phase_of = _Phases(spans)
    found = []
    for kernel in kernels:
        if kernel["name"].startswith(NCCL_KERNELS):
            continue
        op = ops.get(kernel.get("args", {}).get("External id"))
        name = (_named(phase_of(op), _short_op(op["name"])) if op is not None
                else _short_kernel(kernel["name"]))
        found.append((name, COMPUTE, kernel, 0))
    return found


def _cpu_compute(spans) -> list:
    """The outermost operators of the threads that are not gloo's, less the
    time inside communication calls (waiting)."""
    comm_threads = {(e["pid"], e["tid"]) for e in spans if e["name"].startswith("gloo:")}
    phase_of = _Phases(spans)
    by_thread: dict = {}
    for e in spans:
        if e.get("cat") == "cpu_op" and (e["pid"], e["tid"]) not in comm_threads:
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    found = []
    for ops in by_thread.values():
        waits = _outermost([e for e in ops if e["name"].startswith(COMM_CALLS)])
        wait_ends = [w["ts"] + w["dur"] for w in waits]
        for op in _outermost(ops):
            if not op["name"].startswith(COMM_CALLS):
                name = _named(phase_of(op), _short_op(op["name"]))
                found += [(name, COMPUTE, piece, 0) for piece in _minus(op, waits, wait_ends)]
    return found


class _Phases:
    """The phase of an operator: that of the outermost phase-giving event
    (backward, forward, optimizer) enclosing it on its thread, else None."""

    def __init__(self, spans):
        self.threads: dict = {}
        for e in spans:
            if e.get("cat") in ("cpu_op", "user_annotation") and _phase(e["name"]):
                self.threads.setdefault((e["pid"], e["tid"]), []).append(e)
        for key, events in self.threads.items():
            self.threads[key] = _outermost(events)
        self.starts = {key: [e["ts"] for e in events]
                       for key, events in self.threads.items()}

    def __call__(self, op: dict) -> str | None:
        key = (op["pid"], op["tid"])
        index = bisect.bisect_right(self.starts.get(key, []), op["ts"]) - 1
        if index < 0:
            return None
        enclosing = self.threads[key][index]
        inside = op["ts"] + op["dur"] <= enclosing["ts"] + enclosing["dur"]
        return _phase(enclosing["name"]) if inside else None


def _phase(name: str) -> str | None:
    if name.startswith("autograd::engine::evaluate_function:"):
        return "backward"
    if name.startswith(("Optimizer.step", "Optimizer.zero_grad")):
        return "optimizer"
    if name.endswith(".forward"):  # DistributedDataParallel.forward
        return "forward"
    return None


def _outermost(events: list[dict]) -> list[dict]:
    """The events of one thread not inside another, sorted by start; an event
    that sticks out of the one before it keeps only the part after it."""
    kept: list[dict] = []
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        end = e["ts"] + e["dur"]
        if kept and end <= kept[-1]["ts"] + kept[-1]["dur"]:
            continue
        if kept and e["ts"] < kept[-1]["ts"] + kept[-1]["dur"]:
            start = kept[-1]["ts"] + kept[-1]["dur"]
            e = {**e, "ts": start, "dur": end - start}
        kept.append(e)
    return kept


def _minus(op: dict, holes: list[dict], hole_ends: list[float]):
    """The parts of `op` outside the sorted, disjoint `holes`."""
    start, end = op["ts"], op["ts"] + op["dur"]
    for hole in holes[bisect.bisect_right(hole_ends, start):]:
        if hole["ts"] >= end:
            break
        if hole["ts"] > start:
            yield {**op, "ts": start, "dur": hole["ts"] - start}
        start = max(start, hole["ts"] + hole["dur"])
    if end > start:
        yield {**op, "ts": start, "dur": end - start}


def _input_bytes(args: dict) -> int:
    """Bytes of the tensors a record_shapes trace lists on an operator."""
    total = 0
    for dims, dtype in zip(args.get("Input Dims", []), args.get("Input type", [])):
        if isinstance(dims, list) and all(isinstance(d, int) for d in dims) and dims:
            count = 1
            for d in dims:
                count *= d
            total += count * ELEMENT_BYTES.get(dtype, 0)
    return total


def _named(phase: str | None, name: str) -> str:
    return name if phase is None else f"{phase} {name}"


def _short_op(name: str) -> str:
    """"AddmmBackward0" of "autograd::engine::evaluate_function: AddmmBackward0"."""
    return name.rsplit(": ", 1)[-1] if name.startswith("autograd::") else name


def _short_kernel(name: str) -> str:
    """A kernel's name without return type, namespaces, templates, parameters."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    return re.split(r"[<(]", name, maxsplit=1)[0].rsplit("::", 1)[-1] or name
