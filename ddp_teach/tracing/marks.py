"""Mark compute on a traced run's timeline: `span` and `trace_layers`.

Both record through the worker's recorder and do nothing outside a traced
run, so the same training code runs traced and untraced.
"""
import contextlib

from ddp_teach.tracing.events import COMPUTE
from ddp_teach.tracing.recorder import now, record


class span(contextlib.ContextDecorator):
    """Mark a stretch of work, e.g. `with dt.span("backward"): loss.backward()`.

    Also a decorator. Outside a traced run it does nothing, so the same code
    runs traced and untraced. `kind=COMM` marks communication that is not a
    torch.distributed call (an RPC); set `.nbytes` inside to say how much it
    moved.
    """

    def __init__(self, name: str, kind: str = COMPUTE, nbytes: int = 0):
        self.name, self.kind, self.nbytes = name, kind, nbytes

    def __enter__(self):
        self._start = now()
        return self

    def __exit__(self, *exc):
        record(self.name, self.kind, self._start, now(), self.nbytes)
        return False


def trace_layers(model, prefix: str = ""):
    """Record every leaf layer's forward and backward as compute spans.

    A span around `loss.backward()` is too coarse to measure overlap with
    DDP: DDP waits for its last buckets inside `backward()`, so that wait
    would count as computation. Per-layer spans from module hooks cover only
    the arithmetic. Does nothing outside a traced run. Returns the model.
    """
    for name, module in model.named_modules(prefix=prefix):
        if next(module.children(), None) is None and any(
                p.requires_grad for p in module.parameters(recurse=False)):
            _hook_layer(module, name or type(module).__name__)
    return model


def _hook_layer(module, name: str) -> None:
    """Forward: from the forward pre-hook to the forward hook. Backward: from
    when the gradient of the layer's output arrives to when the last of its
    parameters' gradients is accumulated (the moment DDP's hooks fire too)."""
    params = list(module.parameters(recurse=False))
    starts, waiting = {}, {"grads": 0}

    def finish(phase):
        if phase in starts:
            record(f"{phase} {name}", COMPUTE, starts.pop(phase),
                   now())

    def forward_begins(*_):
        starts["forward"] = now()

    def backward_begins(_grad):
        starts["backward"] = now()
        waiting["grads"] = len(params)

    def forward_ends(_module, _inputs, output):
        finish("forward")
        if getattr(output, "requires_grad", False):
            output.register_hook(backward_begins)  # its gradient has arrived

    def grad_accumulated(_param):
        waiting["grads"] -= 1
        if waiting["grads"] == 0:
            finish("backward")

    module.register_forward_pre_hook(forward_begins)
    module.register_forward_hook(forward_ends)
    for param in params:
        param.register_post_accumulate_grad_hook(grad_accumulated)
