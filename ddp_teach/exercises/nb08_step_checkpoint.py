"""Checker for notebook 08's step-checkpoint exercise, on real gloo ranks
(the wrap order and accumulation are in nb08_the_real_job.py).

`my_step_checkpoint_state(model, optimizer, scheduler, step)`: the
reference, `ddp_teach.real_job.step_checkpoint_state`. The checker trains
the notebook's Llama-style model for STEPS steps on `save` ranks, writes
the learner's state with dcp.async_save after SAVE_AT steps, then resumes
on `resume` ranks (4 to 3, then 1 to 2) through `ddp_teach.real_job.resume`
and compares:

- the keys the course's resume reads ("model", "optimizer", "scheduler",
  "rng", "step"), each missing one named with what it is for;
- what the resume restored, piece by piece, against the saving run at
  that step: the step to resume at, the model, AdamW's moments, the
  scheduler's step count, the RNG state (a wrong piece is named);
- the function must not change the training: the RNG state is the same
  before and after it (drawing from it moves the data order);
- the resumed losses equal the uninterrupted run's within
  LOSS_TOLERANCE, relative: the runs are fp32, and the two differ only in
  the order the ranks' gradients are added (another world size), a few
  of fp32's rounding steps (2^-24); 2^-16 leaves room for the steps after.
The warm-up (WARMUP = 6 steps) is still on at SAVE_AT, so a lost
scheduler changes the learning rate.
"""
import shutil
import tempfile

import torch
import torch.distributed as dist

from ddp_teach.exercises.difference import first_difference
from ddp_teach.exercises.harness import run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)
from ddp_teach.llama import LlamaConfig
from ddp_teach import real_job

RESUMES = ((4, 3), (1, 2))           # (ranks that save, ranks that resume)
STEPS, SAVE_AT = 7, 3
LOSS_TOLERANCE = 2.0 ** -16
TIMEOUT_S = 60.0
CONFIG = LlamaConfig(vocab=64, width=32, layers=3, heads=2, kv_heads=1, hidden=64,
                     context=16)


KEY_HINTS = {
    "model": "the model's sharded state: get_state_dict(model, optimizer) gives it",
    "optimizer": "AdamW's moments and step counts: get_state_dict(model, optimizer) "
                 "gives them beside the model's",
    "scheduler": "the learning-rate schedule's position: scheduler.state_dict()",
    "rng": "the RNG that draws the data order: torch.get_rng_state()",
    "step": "the step to resume at (the data position): the step given",
}


def _tokens_for_training():
    return torch.randint(0, CONFIG.vocab, (4096,),
                         generator=torch.Generator().manual_seed(7))


def _snapshot(model, optimizer, scheduler, step):
    """What the training is at `step`, in full, comparable across world sizes."""
    from torch.distributed.tensor import DTensor

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t
    moments = [full(state[key]).clone() for p in model.parameters()
               for key in ("exp_avg", "exp_avg_sq")
               if (state := optimizer.state.get(p)) and key in state]
    return {"step": step, "model": [full(p).detach().clone() for p in model.parameters()],
            "optimizer": moments, "scheduler": scheduler.last_epoch,
            "rng": torch.get_rng_state()}


def _save_run(rank, world_size, fn, path):
    torch.manual_seed(1234)
    model = real_job.build_sharded(CONFIG)
    optimizer, scheduler = real_job.new_optimizer_and_scheduler(model)
    group = dist.new_group(backend="gloo")
    tokens, losses, report = _tokens_for_training(), {}, {}
    for step in range(STEPS):
        if step == SAVE_AT:
            report["snapshot"] = _snapshot(model, optimizer, scheduler, step)
            try:
                state = fn(model, optimizer, scheduler, step)
            except NotImplementedError:
                return NOT_ATTEMPTED
            report["rng_moved"] = not torch.equal(report["snapshot"]["rng"],
                                                  torch.get_rng_state())
            if not isinstance(state, dict):
                return {**report, "not_a_dict": type(state).__name__}
            report["missing"] = [k for k in real_job.CHECKPOINT_KEYS if k not in state]
            if report["missing"]:
                return report
            real_job.save_step_checkpoint(state, path, group).result()
        losses[step] = real_job.train_step(model, optimizer, scheduler, tokens,
                                           rank, world_size)
    return {**report, "losses": losses}


def _resume_run(rank, world_size, fn, path):
    torch.manual_seed(1234)                 # a new job starts as the first did
    model = real_job.build_sharded(CONFIG)
    optimizer, scheduler = real_job.new_optimizer_and_scheduler(model)
    start = real_job.resume(path, model, optimizer, scheduler, fn)
    snapshot = _snapshot(model, optimizer, scheduler, start)
    tokens, losses = _tokens_for_training(), {}
    for step in range(start, STEPS):
        losses[step] = real_job.train_step(model, optimizer, scheduler, tokens,
                                           rank, world_size)
    return {"snapshot": snapshot, "losses": losses}


def _restored_wrong(saved, restored) -> str | None:
    """The first piece the resume did not get back, in the learner's terms."""
    if restored["step"] != saved["step"]:
        return (f"the resumed run starts at step {restored['step']!r}; the "
                f"checkpoint was written after {saved['step']} steps.\nHint: "
                f"\"step\": the step given, which is the data position.")
    if first_difference(restored["model"], saved["model"], atol=0, rtol=0):
        return ("the resumed model is not the one saved.\nHint: \"model\": the "
                "model's state from get_state_dict(model, optimizer).")
    if first_difference(restored["optimizer"], saved["optimizer"], atol=0, rtol=0):
        return ("the resumed AdamW's moments are not the ones saved.\nHint: "
                "\"optimizer\": the optimizer's state from get_state_dict(model, "
                "optimizer); AdamW's moments are as much the training as the weights.")
    if restored["scheduler"] != saved["scheduler"]:
        return (f"the resumed scheduler is at step {restored['scheduler']}, the "
                f"saved one was at {saved['scheduler']}: the learning rate of the "
                f"warm-up starts over.\nHint: \"scheduler\": scheduler.state_dict().")
    if not torch.equal(restored["rng"], saved["rng"]):
        return ("the resumed RNG state is not the one saved, so the resumed run "
                "draws other batches.\nHint: \"rng\": torch.get_rng_state(), the "
                "generator the data order is drawn from.")
    return None


def check_step_checkpoint_state(fn) -> Verdict:
    for save, resume in RESUMES:
        work = tempfile.mkdtemp(prefix="step-checkpoint-check-")
        try:
            saved, problem = run_learner_code(_save_run, save, fn, timeout=TIMEOUT_S,
                                              args=(f"{work}/ckpt",))
            if problem:
                return problem
            first = saved[0]
            where = f"saved on {save} rank(s) after {SAVE_AT} of {STEPS} steps"
            if first["rng_moved"]:
                return Verdict(WRONG, f"{where}: torch's RNG state changed while "
                               f"your function ran: it drew random numbers, and the "
                               f"data order moved.\nHint: read the state "
                               f"(torch.get_rng_state()); do not draw from it.")
            if "not_a_dict" in first:
                return Verdict(WRONG, f"{where}: your function returned a "
                               f"{first['not_a_dict']}, not a dict.\nHint: return "
                               f"{{\"model\": ..., \"optimizer\": ..., \"scheduler\": "
                               f"..., \"rng\": ..., \"step\": ...}}.")
            if first["missing"]:
                key = first["missing"][0]
                return Verdict(WRONG, f"{where}: the checkpoint has no {key!r}, and "
                               f"the resume cannot continue the same training "
                               f"without it.\nHint: \"{key}\": {KEY_HINTS[key]}.")
            resumed, problem = run_learner_code(_resume_run, resume, fn,
                                                timeout=TIMEOUT_S,
                                                args=(f"{work}/ckpt",))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if problem:
            return problem
        where += f", resumed on {resume}"
        wrong = _restored_wrong(first["snapshot"], resumed[0]["snapshot"])
        if wrong:
            return Verdict(WRONG, f"{where}: {wrong}")
        for step, loss in resumed[0]["losses"].items():
            want = first["losses"][step]
            if abs(loss - want) > LOSS_TOLERANCE * abs(want):
                return Verdict(WRONG, f"{where}: at step {step} the resumed loss is "
                               f"{loss:.6f}, the uninterrupted run's {want:.6f}.")
    return Verdict(CORRECT, "saved on 4 ranks and resumed on 3, then saved on 1 "
                   "and resumed on 2: the model, AdamW's moments, the scheduler, "
                   "the RNG and the step came back, and the loss curve went on as "
                   "the uninterrupted run's.")


register(Exercise(
    "step_checkpoint_state", "What a step checkpoint holds",
    "my_step_checkpoint_state", "ddp_teach.real_job:step_checkpoint_state",
    check_step_checkpoint_state,
    ["A resume must continue the same training: list everything the next step "
     "depends on, not only the weights.",
     "Besides the model and the optimizer: the learning-rate schedule, the "
     "random numbers that choose the data, and where in the data you are.",
     "model_state, optimizer_state = get_state_dict(model, optimizer); return "
     "{\"model\": model_state, \"optimizer\": optimizer_state, \"scheduler\": "
     "scheduler.state_dict(), \"rng\": torch.get_rng_state(), \"step\": step}"]))
