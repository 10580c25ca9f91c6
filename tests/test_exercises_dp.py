"""Notebook 02's checkers: each passes the reference and catches three
planted mistakes with the hint that fits."""
import copy
import threading

import pytest
import torch

import ddp_teach.exercises as ex
from ddp_teach import dp
from ddp_teach.exercise_checks_dp import data_parallel_forward


def verdict(name, fn, capsys):
    passed = ex.check(name, fn)
    return passed, capsys.readouterr().out


@pytest.mark.parametrize("name, reference", [
    ("dp_scatter", dp.scatter), ("dp_gather", dp.gather),
    ("dp_replicate", dp.replicate), ("dp_parallel_apply", dp.parallel_apply),
    ("data_parallel", data_parallel_forward)])
def test_the_references_are_correct_and_stubs_not_attempted(name, reference, capsys):
    passed, seen = verdict(name, reference, capsys)
    assert passed and "✅" in seen, seen

    def stub(*args):
        raise NotImplementedError

    passed, seen = verdict(name, stub, capsys)
    assert not passed and "not attempted" in seen


def split_evenly(inputs, devices):
    return list(inputs.tensor_split(len(devices)))


def tensors_only(inputs, devices):
    return list(inputs.chunk(len(devices)))


def always_n_pieces(inputs, devices):
    pieces = list(inputs.chunk(len(devices)))
    return pieces + [inputs[:0]] * (len(devices) - len(pieces))


@pytest.mark.parametrize("planted, hint", [
    (split_evenly, "not tensor_split"),
    (tensors_only, "keep the container"),
    (always_n_pieces, "do not make empty ones"),
])
def test_scatter_mistakes(planted, hint, capsys):
    passed, seen = verdict("dp_scatter", planted, capsys)
    assert not passed and hint in seen, seen


@pytest.mark.parametrize("planted, hint", [
    (lambda outputs, target: torch.stack(outputs), "torch.stack adds a dimension"),
    (lambda outputs, target: torch.cat(outputs[::-1]), "keep the devices' order"),
    (lambda outputs, target: torch.cat(outputs) if isinstance(
        outputs[0], torch.Tensor) else (torch.cat([o[0] for o in outputs]),
                                        outputs[0][1]), "element by element"),
])
def test_gather_mistakes(planted, hint, capsys):
    passed, seen = verdict("dp_gather", planted, capsys)
    assert not passed and hint in seen, seen


def untied(module, devices):
    """Clones every module's parameters separately: tied weights come apart."""
    replicas = []
    for _ in devices:
        replica = copy.copy(module)
        replica._modules = {}
        for name, child in module.named_children():
            twin = copy.copy(child)
            twin._parameters = {k: v.clone() for k, v in child._parameters.items()}
            replica._modules[name] = twin
        replica._buffers = {k: v.clone() for k, v in module._buffers.items()}
        replicas.append(replica)
    return replicas


@pytest.mark.parametrize("planted, hint", [
    (lambda m, devices: [copy.deepcopy(m) for _ in devices], "deepcopy"),
    (lambda m, devices: [m for _ in devices], "each device needs a copy"),
    (untied, "tied weight"),
])
def test_replicate_mistakes(planted, hint, capsys):
    passed, seen = verdict("dp_replicate", planted, capsys)
    assert not passed and hint in seen, seen


def one_thread(replicas, inputs, devices):
    return [r(x) for r, x in zip(replicas, inputs)]


def swallows_errors(replicas, inputs, devices):
    outputs = [None] * len(replicas)

    def work(i):
        try:
            outputs[i] = replicas[i](inputs[i])
        except Exception:
            pass  # planted mistake: the error vanishes with its thread

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outputs


def reversed_outputs(replicas, inputs, devices):
    return dp.parallel_apply(replicas, inputs, devices)[::-1]


@pytest.mark.parametrize("planted, hint", [
    (one_thread, "start a threading.Thread per replica"),
    (swallows_errors, "an exception in a thread is lost"),
    (reversed_outputs, "at its replica's index"),
])
def test_parallel_apply_mistakes(planted, hint, capsys):
    passed, seen = verdict("dp_parallel_apply", planted, capsys)
    assert not passed and hint in seen, seen


def deepcopied_replicas(module, inputs, devices):
    pieces = dp.scatter(inputs, devices)
    outs = [copy.deepcopy(module)(p) for p in pieces]
    return dp.gather(outs, devices[0])


def first_piece_only(module, inputs, devices):
    return module(dp.scatter(inputs, devices)[0])


def no_gather(module, inputs, devices):
    pieces = dp.scatter(inputs, devices)
    return [module(p) for p in pieces]


@pytest.mark.parametrize("planted, hint", [
    (deepcopied_replicas, "gradients differ"),
    (first_piece_only, "gather the replicas' outputs"),
    (no_gather, "gather the replicas' outputs"),
])
def test_data_parallel_mistakes(planted, hint, capsys):
    passed, seen = verdict("data_parallel", planted, capsys)
    assert not passed and hint in seen, seen
