"""Notebook 02's planted mistakes for the forward of DataParallel (PLANTED,
run by test_registry.py): each must get the hint that names it."""
import copy
import weakref

import torch

from ddp_teach import dp


def deepcopied_replicas(module, inputs, devices):
    pieces = dp.scatter(inputs, devices)
    outs = [copy.deepcopy(module)(p) for p in pieces]
    return dp.gather(outs, devices[0])


def first_piece_only(module, inputs, devices):
    return module(dp.scatter(inputs, devices)[0])


def no_gather(module, inputs, devices):
    pieces = dp.scatter(inputs, devices)
    return [module(p) for p in pieces]


def gather_detached(module, inputs, devices):
    pieces = dp.scatter(inputs, devices)
    used = devices[:len(pieces)]
    outs = dp.parallel_apply(dp.replicate(module, used), pieces, used)
    return torch.cat([o.detach() for o in outs])


def replicas_for_every_device(module, inputs, devices):
    pieces = dp.scatter(inputs, devices)
    outs = dp.parallel_apply(dp.replicate(module, devices), pieces, devices)
    return dp.gather(outs, devices[0])


def a_loop_for_parallel_apply(module, inputs, devices):
    pieces = dp.scatter(inputs, devices)
    replicas = dp.replicate(module, devices[:len(pieces)])
    return dp.gather([r(p) for r, p in zip(replicas, pieces)], devices[0])


_KEPT = weakref.WeakKeyDictionary()


def replicas_kept(module, inputs, devices):
    """Replicates once per module and device count, to save the copies."""
    pieces = dp.scatter(inputs, devices)
    used = devices[:len(pieces)]
    kept = _KEPT.setdefault(module, {})
    if len(used) not in kept:
        kept[len(used)] = dp.replicate(module, used)
    return dp.gather(dp.parallel_apply(kept[len(used)], pieces, used), devices[0])


def the_module_on_the_batch(module, inputs, devices):
    return module(*inputs) if isinstance(inputs, tuple) else module(inputs)


def the_original_in_every_thread(module, inputs, devices):
    """Replicas forgotten: the original module runs on every piece."""
    pieces = dp.scatter(inputs, devices)
    used = devices[:len(pieces)]
    return dp.gather(dp.parallel_apply([module] * len(used), pieces, used), devices[0])


def pieces_wrapped_in_tuples(module, inputs, devices):
    pieces = dp.scatter(inputs, devices)
    used = devices[:len(pieces)]
    outs = dp.parallel_apply(dp.replicate(module, used), [(p,) for p in pieces], used)
    return dp.gather(outs, devices[0])


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("data_parallel", deepcopied_replicas, ("no gradient reached", "copy.deepcopy")),
    ("data_parallel", first_piece_only, "gather the replicas' outputs"),
    ("data_parallel", no_gather, "gather the replicas' outputs"),
    ("data_parallel", gather_detached, ("no gradient reached", ".detach()")),
    ("data_parallel", replicas_for_every_device,
     ("3 rows on 4 devices", "make as many replicas as there are pieces")),
    ("data_parallel", a_loop_for_parallel_apply,
     ("ran in your calling thread", "run the replicas with parallel_apply")),
    ("data_parallel", replicas_kept, "replicate on every call"),
    ("data_parallel", pieces_wrapped_in_tuples, ("forward(x, w)", "scatter the whole tuple")),
    ("data_parallel", the_module_on_the_batch, "the module ran once, on the whole batch"),
    ("data_parallel", the_original_in_every_thread, "the original module itself ran"),
]
