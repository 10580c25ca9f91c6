"""Notebook 02's planted mistakes for parallel_apply (PLANTED, run by
test_registry.py): each must get the hint that names it. Below them, a hint
that must show what differs, and what the probe costs a right answer."""
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from ddp_teach import dp
from ddp_teach.exercises import nb02_threads


def threaded(**mistake):
    """A parallel_apply with one thread per replica, right but for the
    mistake that the keyword names (its test id too)."""
    unpack, carry_grad_mode = mistake.get("unpack", True), mistake.get("carry_grad_mode", True)
    no_grad_inside, join_each = mistake.get("no_grad_inside"), mistake.get("join_each")
    keep, on_error = mistake.get("keep", "index"), mistake.get("on_error", "raise named")

    def my_parallel_apply(replicas, inputs, devices):
        grad = torch.is_grad_enabled()
        results, errors, finished = [None] * len(replicas), [None] * len(replicas), []

        def work(i):
            args = inputs[i] if unpack and isinstance(inputs[i], tuple) else (inputs[i],)
            inside = torch.no_grad() if no_grad_inside else contextlib.nullcontext()
            try:
                with torch.set_grad_enabled(grad if carry_grad_mode else True), inside:
                    out = replicas[i](*args)
                if keep == "index":
                    results[i] = out
                else:
                    finished.append(out)
            except Exception as exc:
                errors[i] = exc

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(replicas))]
        for t in threads:
            t.start()
            if join_each:
                t.join()
        for t in threads:
            t.join()
        for i, exc in enumerate(errors):
            if exc is None or on_error == "swallow":
                continue
            if on_error == "return":
                results[i] = exc
            elif on_error == "raise bare":
                raise exc
            else:
                raise RuntimeError(f"replica {i} on {devices[i]}: {exc}") from exc
        return results if keep == "index" else finished
    my_parallel_apply.__name__ = "threads_" + "_".join(
        f"{k}_{v}".replace(" ", "_") for k, v in mistake.items())
    return my_parallel_apply


def one_thread(replicas, inputs, devices):
    return [r(*x) if isinstance(x, tuple) else r(x) for r, x in zip(replicas, inputs)]


def reversed_outputs(replicas, inputs, devices):
    return dp.parallel_apply(replicas, inputs, devices)[::-1]


def never_joined(replicas, inputs, devices):
    """Starts the threads and returns at once."""
    results = [None] * len(replicas)

    def work(i):
        x = inputs[i]
        results[i] = replicas[i](*x) if isinstance(x, tuple) else replicas[i](x)
    for i in range(len(replicas)):
        threading.Thread(target=work, args=(i,), daemon=True).start()
    return results


def replica_as_the_target(replicas, inputs, devices):
    """Thread(target=replica): the thread throws the output away."""
    results = [None] * len(replicas)
    threads = [threading.Thread(target=r, args=x if isinstance(x, tuple) else (x,))
               for r, x in zip(replicas, inputs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def pool_of_two(replicas, inputs, devices):
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda r, x: r(*x) if isinstance(x, tuple) else r(x),
                             replicas, inputs))


def raises_at_the_first_join(replicas, inputs, devices):
    """Joins in order and raises as soon as a joined replica failed: the
    replicas after it may still be running."""
    results, errors = [None] * len(replicas), [None] * len(replicas)
    grad = torch.is_grad_enabled()

    def work(i):
        args = inputs[i] if isinstance(inputs[i], tuple) else (inputs[i],)
        try:
            with torch.set_grad_enabled(grad):
                results[i] = replicas[i](*args)
        except Exception as exc:
            errors[i] = exc
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(replicas))]
    for t in threads:
        t.start()
    for i, t in enumerate(threads):
        t.join()
        if errors[i] is not None:
            raise RuntimeError(f"replica {i}: {errors[i]}")
    return results


def capitalised_names(replicas, inputs, devices):
    """Right, naming the replica with a capital and keeping the cause."""
    results, errors = [None] * len(replicas), {}

    def work(i, grad):
        with torch.set_grad_enabled(grad):
            try:
                results[i] = replicas[i](*inputs[i]) if isinstance(inputs[i], tuple) \
                    else replicas[i](inputs[i])
            except Exception as exc:
                errors[i] = exc
    threads = [threading.Thread(target=work, args=(i, torch.is_grad_enabled()))
               for i in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        first = min(errors)
        raise ValueError(f"Replica {first} FAILED ON {devices[first].upper()}") \
            from errors[first]
    return results


def pool_as_wide_as_the_replicas(replicas, inputs, devices):
    """Right, in another style: a pool with a worker per replica; the
    first error is re-raised by future.result(), with its device named."""
    grad = torch.is_grad_enabled()

    def call(replica, x):
        with torch.set_grad_enabled(grad):
            return replica(*x) if isinstance(x, tuple) else replica(x)
    with ThreadPoolExecutor(max_workers=len(replicas)) as pool:
        futures = [pool.submit(call, r, x) for r, x in zip(replicas, inputs)]
    outputs = []
    for index, future in enumerate(futures):
        try:
            outputs.append(future.result())
        except Exception as exc:
            raise RuntimeError(f"Device {index} ({devices[index]}): {exc}") from exc
    return outputs


def test_a_failing_replica_named_in_any_case_or_style_is_right(verdict):
    for right in (capitalised_names, pool_as_wide_as_the_replicas):
        passed, seen = verdict("dp_parallel_apply", right)
        assert passed, seen


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("dp_parallel_apply", one_thread, "start a threading.Thread per replica"),
    ("dp_parallel_apply", threaded(on_error="swallow"), "an exception in a thread is lost"),
    ("dp_parallel_apply", reversed_outputs, "at its replica's index"),
    ("dp_parallel_apply", threaded(join_each=True),
     ("with 2 replicas", "at most 1 of 2", "joined before the next one started")),
    ("dp_parallel_apply", threaded(keep="finish order"), "(results.append)"),
    ("dp_parallel_apply", threaded(unpack=False), "call replicas[i](*inputs[i])"),
    ("dp_parallel_apply", threaded(carry_grad_mode=False),
     ("under torch.no_grad()", "grad mode belongs to each thread")),
    ("dp_parallel_apply", threaded(no_grad_inside=True), "carry no autograd graph"),
    ("dp_parallel_apply", threaded(on_error="return"), "returned the exception"),
    ("dp_parallel_apply", threaded(on_error="raise bare"), "say which replica"),
    ("dp_parallel_apply", pool_of_two, ("at most 2 of 3", "fewer threads than replicas")),
    ("dp_parallel_apply", never_joined, ("got None", "join() every thread")),
    ("dp_parallel_apply", replica_as_the_target, "throws its target's return value away"),
    ("dp_parallel_apply", raises_at_the_first_join, ("replica 1 failed",
                                                     "still running")),
]


def test_parallel_apply_shows_the_values_that_differ(verdict):
    """Before, this read "expected [tensor(3, 1)...] got [tensor(3, 1)...]"."""
    passed, seen = verdict("dp_parallel_apply",
                           lambda replicas, inputs, devices: list(inputs))
    assert not passed, seen
    assert "output 0 should be replicas[i](inputs[i]): [0, 2, 4]; got [0, 1, 2]" in seen, seen


def test_a_parallel_run_of_the_reference_never_waits_at_the_meeting():
    """The barrier costs a right answer nothing: its check stays fast."""
    start = time.perf_counter()
    assert nb02_threads.check_parallel_apply(dp.parallel_apply).status == "correct"
    assert time.perf_counter() - start < nb02_threads.MEET_TIMEOUT_S
