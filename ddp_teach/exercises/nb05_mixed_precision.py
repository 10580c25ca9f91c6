"""Checker for notebook 05's loss-scale exercise (the 16-bit compression
hook is checked in nb05_compression_hook.py).

`loss_scale_update` is checked here in the kernel against
`dt.amp.next_scale` (which tests/course/test_amp.py holds equal to torch's
GradScaler) over scripted runs of clean and overflowing steps. The
reference guarantees:

- the scale after every step, and the count of clean steps it returns
  (GradScaler's `_growth_tracker`, 0 after any change of the scale);
- back-off on every overflow, growth after each run of growth_interval
  clean steps (growth_interval 1 included);
- the scale stays a finite fp32 number: a growth past fp32's largest is
  not applied (not clamped either), as GradScaler keeps a grown scale only
  if it is finite; between fp16's largest (65504) and fp32's it grows as
  anywhere else (the scale is fp32, whatever the gradients' format);
- no state of its own: the same arguments give the same answer.

Wrong answers are matched with the typical mistakes (no back-off, a count
not restarted, growth one step late or early, the factors swapped, no fp32
limit, the scale clamped at fp32's or at fp16's largest, a counter of its
own) so the hint names the one made.
"""
import torch

from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

# (init scale, growth_factor, backoff_factor, growth_interval, found_inf flags)
SCALE_CASES = [
    (1024.0, 2.0, 0.5, 3, [False] * 7 + [True] + [False] * 4 + [True, True]
     + [False] * 3),
    (1024.0, 4.0, 0.25, 2, [False, True, False, False, False, True, False, False]),
    (1024.0, 2.0, 0.5, 1, [False, False, True, False]),
    # past fp16's largest (65504) and on: the scale is an fp32 number
    (32768.0, 2.0, 0.5, 1, [False, False, True, False]),
    (2.0 ** 127, 2.0, 0.5, 1, [False, False]),  # growth would pass fp32's max
    # growth that lands exactly on fp32's largest: finite, so it is kept
    (float(torch.finfo(torch.float32).max) / 2, 2.0, 0.5, 1, [False]),
]
FP16_MAX = torch.finfo(torch.float16).max
FP32_MAX = torch.finfo(torch.float32).max


def _pair(returned):
    """(scale, tracker) as (float, int), or None if not a pair of numbers."""
    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        return None
    try:
        return float(returned[0]), int(returned[1])
    except (TypeError, ValueError):
        return None


def scale_history(update, init, growth, backoff, interval, script):
    """[(scale, tracker)] after each step of `script`, using `update`; a
    string saying what `update` returned when it is not a pair."""
    scale, tracker, history = init, 0, []
    for found_inf in script:
        returned = update(scale, tracker, found_inf, growth, backoff, interval)
        pair = _pair(returned)
        if pair is None:
            return f"{returned!r:.80}"
        scale, tracker = pair
        history.append(pair)
    return history


def check_loss_scale_update(fn) -> Verdict:
    from ddp_teach.amp import next_scale
    try:
        first, again = (_pair(fn(1024.0, 0, False, 2.0, 0.5, 3)) for _ in range(2))
    except NotImplementedError:
        return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
    if first is not None and first != again:
        return Verdict(WRONG, f"called twice with the same arguments (scale "
                       f"1024, count 0, a clean step) it returned {first}, then "
                       f"{again}.\nHint: keep no count of your own: the count "
                       "of clean steps comes in as growth_tracker and goes out "
                       "as the second value returned.")
    for init, growth, backoff, interval, script in SCALE_CASES:
        want = scale_history(next_scale, init, growth, backoff, interval, script)
        got = scale_history(fn, init, growth, backoff, interval, script)
        if isinstance(got, str):
            return Verdict(WRONG, f"update_scale returned {got}.\nHint: return "
                           "the pair (new_scale, new_growth_tracker).")
        for step, (mine, right) in enumerate(zip(got, want)):
            if mine == right:
                continue
            shown = (f"growth_factor {growth}, backoff_factor {backoff}, "
                     f"growth_interval {interval}, starting at {init:g}; "
                     f"steps so far (True = inf/NaN found): "
                     f"{script[:step + 1]}.\nAfter step {step} the scale and "
                     f"count should be ({right[0]:g}, {right[1]}), got "
                     f"({mine[0]:g}, {mine[1]}).\nHint: ")
            before = want[step - 1][0] if step else init
            return Verdict(WRONG, shown + _scale_hint(script, step, mine, right,
                                                     before, growth, backoff))
    return Verdict(CORRECT, "the same scales and counts as torch's GradScaler: "
                            "back-off on every overflow, growth after each run "
                            "of growth_interval clean steps, never past fp32.")


def _scale_hint(script, step, mine, right, before, growth, backoff) -> str:
    if mine[0] == right[0] and script[step]:
        return ("the scale is right but the count is not: restart the count "
                "of clean steps at 0 whenever an overflow happens.")
    if mine[0] == right[0]:
        return ("the scale is right but the count is not: it counts the clean "
                "steps since the scale last changed, so it goes back to 0 "
                "after a growth too.")
    if script[step] and mine[0] == before * growth or (
            right[0] == before * growth and mine[0] == before * backoff):
        return ("the scale " + ("grew on an overflow" if script[step] else
                                "shrank where it should have grown")
                + ": growth_factor and backoff_factor are swapped.")
    if script[step]:
        return ("an overflow (found_inf True) must multiply the scale by "
                "backoff_factor and restart the count of clean steps at 0.")
    if mine[0] < right[0] and right[0] > FP16_MAX >= mine[0]:
        return (f"the scale was held at {mine[0]:g}, below fp16's largest "
                f"number ({FP16_MAX:g}), where it should have grown to "
                f"{right[0]:g}: the scale is an fp32 number (GradScaler keeps "
                "it in an fp32 tensor), and only fp32's largest, "
                "torch.finfo(torch.float32).max, limits it. fp16's limit is "
                "for the values the scale multiplies.")
    if mine[0] > FP32_MAX:
        return ("the scale passed fp32's largest number (GradScaler's scale, an "
                "fp32 tensor, would be inf): a growth past "
                "torch.finfo(torch.float32).max is not applied; GradScaler "
                "keeps the old scale then.")
    if right[0] == before and before * growth > FP32_MAX and mine[0] != before:
        return (f"growing {before:g} by {growth:g} passes fp32's largest "
                f"number, and your scale became {mine[0]:g}: GradScaler does "
                "not clamp it there, it keeps the old scale (a grown scale is "
                "kept only if it is finite in fp32).")
    if mine[0] > right[0] and True in script[:step]:
        return ("the scale grew too early after an overflow: restart the "
                "count of clean steps at 0 whenever an overflow happens.")
    if mine[0] > right[0]:
        return ("the scale grew too early: after growing, restart the count at "
                "0; grow only when the count of clean steps reaches growth_interval.")
    return ("the scale should have grown: add 1 to the count on a clean step, "
            "and when it reaches growth_interval multiply the scale by "
            "growth_factor (and restart the count).")


register(Exercise(
    name="loss_scale_update", title="The loss scale's update rule",
    stub_name="update_scale", reference="ddp_teach.amp:next_scale",
    checker=check_loss_scale_update,
    hints=["Two cases: the step overflowed (found_inf) or it was clean.",
           "Overflow: scale * backoff_factor, and the count of clean steps "
           "goes back to 0. Clean: the count goes up by one.",
           "When the count reaches growth_interval, multiply the scale by "
           "growth_factor (unless that passes fp32's largest number) and set "
           "the count back to 0."],
    stub_parameters=("scale", "growth_tracker", "found_inf", "growth_factor",
                     "backoff_factor", "growth_interval")))
