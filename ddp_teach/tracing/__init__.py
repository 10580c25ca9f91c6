"""What each rank did, and when: recorded in the workers, drawn in the kernel.

`recorder` wraps torch.distributed's calls in a traced run; `marks` lets the
learner mark compute (`span`, `trace_layers`); `events` is the record both
produce; `timeline` turns every rank's events into numbers (overlap, idle
time, bytes) and pictures, which `drawing` draws. `torch_profiler` (with
`profiler_events`) reads the traces torch.profiler wrote on each rank into
the same events (`Timeline.from_torch_profiler`).
"""
from ddp_teach.tracing.events import COMM, COMPUTE, Event
from ddp_teach.tracing.marks import span, trace_layers
from ddp_teach.tracing.recorder import labelled, now, record
from ddp_teach.tracing.timeline import Timeline

__all__ = ["COMM", "COMPUTE", "Event", "Timeline", "labelled", "now", "record",
           "span", "trace_layers"]
