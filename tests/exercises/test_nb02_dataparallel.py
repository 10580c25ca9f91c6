"""Notebook 02's planted mistakes (PLANTED, run by test_registry.py, which
also checks every reference and stub): each must get the hint that fits."""
import copy
import threading

import torch

from ddp_teach import dp


def split_evenly(inputs, devices):
    return list(inputs.tensor_split(len(devices)))


def tensors_only(inputs, devices):
    return list(inputs.chunk(len(devices)))


def always_n_pieces(inputs, devices):
    pieces = list(inputs.chunk(len(devices)))
    return pieces + [inputs[:0]] * (len(devices) - len(pieces))


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


def deepcopied_replicas(module, inputs, devices):
    pieces = dp.scatter(inputs, devices)
    outs = [copy.deepcopy(module)(p) for p in pieces]
    return dp.gather(outs, devices[0])


def first_piece_only(module, inputs, devices):
    return module(dp.scatter(inputs, devices)[0])


def no_gather(module, inputs, devices):
    pieces = dp.scatter(inputs, devices)
    return [module(p) for p in pieces]


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("dp_scatter", split_evenly, "not tensor_split"),
    ("dp_scatter", tensors_only, "keep the container"),
    ("dp_scatter", always_n_pieces, "do not make empty ones"),
    ("dp_gather", lambda outputs, target: torch.stack(outputs), "torch.stack adds a dimension"),
    ("dp_gather", lambda outputs, target: torch.cat(outputs[::-1]), "keep the devices' order"),
    ("dp_gather", lambda outputs, target: torch.cat(outputs) if isinstance(
        outputs[0], torch.Tensor) else (torch.cat([o[0] for o in outputs]),
                                        outputs[0][1]), "element by element"),
    ("dp_replicate", lambda m, devices: [copy.deepcopy(m) for _ in devices], "deepcopy"),
    ("dp_replicate", lambda m, devices: [m for _ in devices], "each device needs a copy"),
    ("dp_replicate", untied, "tied weight"),
    ("dp_parallel_apply", one_thread, "start a threading.Thread per replica"),
    ("dp_parallel_apply", swallows_errors, "an exception in a thread is lost"),
    ("dp_parallel_apply", reversed_outputs, "at its replica's index"),
    ("data_parallel", deepcopied_replicas, "gradients differ"),
    ("data_parallel", first_piece_only, "gather the replicas' outputs"),
    ("data_parallel", no_gather, "gather the replicas' outputs"),
]

