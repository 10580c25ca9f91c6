"""Notebook 02's planted mistakes for replicate (PLANTED, run by
test_registry.py): each must get the hint that names it."""
import copy

from torch import nn

from ddp_teach import dp


def clone_params(module, replica, clones, make):
    """Give replica (a copy of module's structure) the tensors make(p),
    memoised by id(p) in clones; the learner's usual loop."""
    for original, twin in zip(module.modules(), replica.modules()):
        for name, p in list(original._parameters.items()):
            if p is None:
                continue
            copied = clones.setdefault(id(p), make(p))
            del twin._parameters[name]
            setattr(twin, name, copied)


def deepcopied_then(make, shared_memo=False):
    def replicate(module, devices):
        replicas, clones = [], {}
        for _ in devices:
            replica = copy.deepcopy(module)
            clone_params(module, replica, clones if shared_memo else {}, make)
            replicas.append(replica)
        return replicas
    return replicate


def untied(module, devices):
    """Clones every module's parameters separately: tied weights come apart."""
    replicas = []
    for _ in devices:
        replica = copy.copy(module)
        replica._modules = {}
        for name, child in module.named_children():
            twin = copy.copy(child)
            twin._parameters = {k: None if v is None else v.clone()
                                for k, v in child._parameters.items()}
            replica._modules[name] = twin
        replica._buffers = {k: v.clone() for k, v in module._buffers.items()}
        replicas.append(replica)
    return replicas


shared_memo = deepcopied_then(lambda p: p.clone(), shared_memo=True)
shared_memo.__doc__ = "The memo of clones made once, outside the loop over devices."
to_same_device = deepcopied_then(lambda p: p.to("cpu"))
to_same_device.__doc__ = "p.to(device) is p itself on its own device: an alias."
new_parameters = deepcopied_then(lambda p: nn.Parameter(p.clone()))
new_parameters.__doc__ = "nn.Parameter(...) makes a new leaf: no gradient back."


def loads_the_state(module, devices):
    """Deep copies given the original's values with load_state_dict."""
    replicas = [copy.deepcopy(module) for _ in devices]
    for replica in replicas:
        replica.load_state_dict(module.state_dict())
    return replicas


def top_module_only(module, devices):
    """Replaces the top module's own parameters, not its submodules'."""
    replicas = []
    for _ in devices:
        replica = copy.deepcopy(module)
        for name, p in list(module._parameters.items()):
            if p is not None:
                del replica._parameters[name]
                setattr(replica, name, p.clone())
        replicas.append(replica)
    return replicas


def shallow_copies(module, devices):
    return [copy.copy(module) for _ in devices]


def edits_the_original(module, devices):
    """The usual loop with the two names swapped: the original's parameters
    are replaced by plain tensors, the replicas stay deep copies."""
    replicas, clones = [copy.deepcopy(module) for _ in devices], {}
    for replica in replicas:
        for original, twin in zip(module.modules(), replica.modules()):
            for name, p in list(original._parameters.items()):
                if p is not None:
                    copied = clones.setdefault(id(p), p.clone())
                    del original._parameters[name]   # meant: twin
                    setattr(original, name, copied)   # meant: twin
    return replicas


def clones_none(module, devices):
    """Forgets that a parameter may be None (a Linear without bias)."""
    replicas = []
    for _ in devices:
        replica, clones = copy.deepcopy(module), {}
        for original, twin in zip(module.modules(), replica.modules()):
            for name, p in list(original._parameters.items()):
                copied = clones.setdefault(id(p), p.clone())
                del twin._parameters[name]
                setattr(twin, name, copied)
        replicas.append(replica)
    return replicas


def shared_buffers(module, devices):
    replicas = dp.replicate(module, devices)
    for replica in replicas:
        replica.offset = module.offset
    return replicas


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("dp_replicate", lambda m, devices: [copy.deepcopy(m) for _ in devices], "deepcopy"),
    ("dp_replicate", lambda m, devices: [m for _ in devices], "each device needs a copy"),
    ("dp_replicate", untied, "tied weight"),
    ("dp_replicate", shared_memo, "keep the memo of copies per replica"),
    ("dp_replicate", to_same_device, ("an alias, not a copy", "p.to(device) returns p itself")),
    ("dp_replicate", new_parameters, ("nn.Parameter(...)", "still an nn.Parameter of its own")),
    ("dp_replicate", shallow_copies, "copy.copy copies only the outer module"),
    ("dp_replicate", edits_the_original, "never on the original's modules"),
    ("dp_replicate", clones_none, ("AttributeError", "keep None as it is")),
    ("dp_replicate", shared_buffers, "changed the original's"),
    ("dp_replicate", loads_the_state, ("still an nn.Parameter of its own", "load_state_dict")),
    ("dp_replicate", top_module_only, ("still an nn.Parameter of its own",
                                       "in every submodule")),
]


def test_replicas_for_at_most_three_devices_are_caught_on_four(verdict):
    """1 to 5 devices are tried, smallest first: an answer capped at 3
    replicas fails on 4, and the verdict says so."""
    def at_most_three(module, devices):
        return dp.replicate(module, devices[:3])
    passed, seen = verdict("dp_replicate", at_most_three)
    assert not passed and "for 4 devices your function returned [" in seen, seen
