"""The package's shape: the names learners use, and modules that import alone.

Notebooks, the README and learners' own code reach the package through the
names listed here; internal paths may move, these may not. Every submodule
must also import FIRST in a fresh interpreter: an import cycle (zero.py and
fsdp.py importing each other, say) passes when something else happened to
import the package before, and fails for the learner who imports the module
directly.
"""
import ast
import pkgutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import ddp_teach as dt

ROOT = Path(__file__).resolve().parents[1]

# (dotted name under ddp_teach, kind): every name the notebooks, README and
# exercises use, found by reading them.
PUBLIC_NAMES = [
    ("run", "function"), ("RunResult", "class"), ("WorkerError", "class"),
    ("WorkerTimeout", "class"), ("shutdown", "function"), ("progress", "function"),
    ("span", "class"),
    ("trace_layers", "function"), ("Timeline", "class"),
    ("Timeline.compare", "function"),
    ("Timeline.after_last_barrier", "function"),
    ("load_ipython_extension", "function"),
    ("collectives.ring_allreduce", "function"),
    ("collectives.ring_all_gather", "function"),
    ("cost.Link", "class"), ("cost.Link.from_latency_bandwidth", "function"),
    ("cost.allreduce_time", "function"), ("cost.broadcast_time", "function"),
    ("bandwidth.sweep", "function"), ("cost.busbw", "function"),
    ("cost.busbw_factor", "function"), ("cost.algbw", "function"),
    ("cost.fit_alpha_beta", "function"),
    ("diagrams.draw", "function"), ("diagrams.draw_all", "function"),
    ("diagrams.layout", "function"),
    ("dp.DataParallel", "class"), ("dp.replicate", "function"),
    ("dp.scatter", "function"), ("dp.parallel_apply", "function"),
    ("dp.gather", "function"),
    ("ddp.DistributedDataParallel", "class"), ("ddp.MIB", "value"),
    ("ddp.bucket_indices", "function"),
    ("sampler.DistributedSampler", "class"), ("sampler.rank_indices", "function"),
    ("syncbn.SyncBatchNorm", "class"), ("syncbn.SyncBatchNorm.convert", "function"),
    ("syncbn.global_batch_stats", "function"),
    ("precision", "module"),
    ("amp.LossScaler", "class"), ("amp.next_scale", "function"),
    ("amp.fp16_allreduce_hook", "function"), ("amp.bf16_allreduce_hook", "function"),
    ("memory.zero_bytes_per_device", "function"), ("memory.STAGE_NAMES", "value"),
    ("memory.format_bytes", "function"), ("memory.format_count", "function"),
    ("memory.measure_model_bytes", "function"),
    ("memory.plot_zero_memory", "function"), ("memory.zero_comm_volume", "function"),
    ("memory.zero_table", "function"),
    ("flat.flat_slice", "function"), ("flat.shard_size", "function"),
    ("flat.unflatten", "function"),
    ("zero.ShardedOptimizer", "class"), ("zero.Zero2DataParallel", "class"),
    ("zero.FullyShardedDataParallel", "class"), ("zero.flat_slice", "function"),
    ("zero.shard_size", "function"), ("zero.model_state_bytes", "function"),
    ("zero.paper_comm_volume", "function"),
    ("fsdp.FullyShardedDataParallel", "class"),
    ("scripts.export", "function"), ("scripts.torchrun", "function"),
    ("slurm.dry_run", "function"), ("slurm.sbatch_script", "function"),
    ("checkpoint.save_checkpoint", "function"),
    ("checkpoint.load_checkpoint", "function"),
    ("paramserver.start_rpc", "function"), ("paramserver.train", "function"),
    ("paramserver.ddp_train", "function"), ("paramserver.sync_update", "function"),
    ("paramserver.async_update", "function"),
    ("diagrams.parameter_server_traffic", "function"), ("paramserver.tensor_bytes", "function"),
    ("pipeline.gpipe_step", "function"), ("pipeline.bubble_fraction", "function"),
    ("pipeline.split_layers", "function"), ("pipeline.measured_bubble", "function"),
    ("pipeline.pipeline_bytes", "function"),
    ("tensor_parallel.ParallelMLP", "class"),
    ("tensor_parallel.megatron_mlp_bytes", "function"),
    ("dtensor_traffic.CollectiveCounter", "class"),
    ("dtensor_traffic.tensor_parallel_block_bytes", "function"),
    ("dtensor_traffic.sequence_parallel_block_bytes", "function"),
    ("debugging.ReplicaWatch", "class"),
    ("debugging.compare_replicas", "function"),
    ("debugging.nonfinite_ranks", "function"),
    ("debugging.FirstNonFinite", "class"),
    ("lm.stdlib_corpus", "function"), ("lm.CharVocab", "class"),
    ("lm.TinyGPT", "class"), ("lm.batch_for_step", "function"),
    ("lm.next_token_loss", "function"), ("lm.unigram_entropy", "function"),
    ("lm.generate", "function"),
    ("llama.Llama", "class"), ("llama.LlamaBlock", "class"), ("llama.LlamaConfig", "class"),
    ("llama.llama3_8b", "function"), ("llama.parameter_count", "function"),
    ("llama.rotary_tables", "function"), ("llama.next_token_loss", "function"),
    ("real_job.global_batch", "function"), ("real_job.my_rows", "function"),
    ("real_job.step_checkpoint_state", "function"), ("real_job.shard_model", "function"),
    ("real_job.resume", "function"), ("real_job.save_step_checkpoint", "function"),
    ("real_job.build_sharded", "function"),
    ("real_job.accumulate_gradients", "function"), ("sim.predict.fsdp2", "function"),
    ("models.reference_mlp", "function"),
    ("system.describe", "function"), ("system.cpu_cores", "function"),
    ("system.gpu_count", "function"), ("system.choose_backend", "function"),
    ("system.ddp_on_local_gpu", "function"),
    ("widgets.allreduce_explorer", "function"), ("widgets.zero_calculator", "function"),
    ("exercises.check", "function"), ("exercises.hint", "function"),
    ("exercises.solution", "function"),
    ("exercises.reference_solution", "function"),
    ("sim.Simulation", "class"), ("sim.Device", "class"), ("sim.DEVICES", "value"),
    ("sim.LINKS", "value"), ("sim.predict.profile", "function"),
    ("sim.predict.compute_only", "function"), ("sim.predict.naive_ddp", "function"),
    ("sim.predict.bucketed_ddp", "function"), ("sim.predict.gpipe", "function"),
    ("sim.predict.pipeline_stage", "function"), ("models.resnet50", "function"),
    ("sim.one_rank", "function"), ("sim.predict.zero3", "function"),
    ("sim.predict.zero3_profile", "function"), ("sim.SimulatedGPUs", "class"),
    ("sim.published.table", "function"), ("sim.published.MEASUREMENTS", "value"),
    ("sim.gpu_surveys.best_square_tflops", "function"),
    ("sim.gpu_surveys.MEASUREMENTS", "value"),
    ("sim.measurement.LOW", "value"), ("sim.measurement.HIGH", "value"),
    ("tracing.now", "function"),
]
KINDS = {"function": callable, "class": lambda obj: isinstance(obj, type),
         "module": lambda obj: isinstance(obj, types.ModuleType),
         "value": lambda obj: obj is not None}


@pytest.mark.parametrize("dotted, kind", PUBLIC_NAMES, ids=[n for n, _ in PUBLIC_NAMES])
def test_every_public_name_keeps_working(dotted, kind):
    obj = dt
    for part in dotted.split("."):
        assert hasattr(obj, part), f"dt.{dotted} is gone: notebooks use it"
        obj = getattr(obj, part)
    assert KINDS[kind](obj), f"dt.{dotted} is no longer a {kind}"


def test_all_names_exactly_the_public_modules_and_functions():
    modules = {name for name, value in vars(dt).items()
               if isinstance(value, types.ModuleType)}
    on_disk = {m.name for m in pkgutil.iter_modules(dt.__path__)}
    assert modules == on_disk, "every module and folder of ddp_teach is public"
    assert set(dt.__all__) == modules | {
        "run", "RunResult", "WorkerError", "WorkerTimeout", "shutdown", "progress", "span",
        "trace_layers", "Timeline"}
    assert len(dt.__all__) == len(set(dt.__all__))


def test_the_launcher_and_the_scripts_keep_their_own_torchrun():
    # dt.scripts.torchrun is the function learners call; the runner module
    # behind it lives in the launcher, not at the top of the package
    assert callable(dt.scripts.torchrun)
    assert not hasattr(dt, "torchrun")
    assert dt.scripts.torchrun is dt.launcher.torchrun.torchrun


def _every_submodule() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(dt.__path__, "ddp_teach."))


def test_the_package_has_the_layout_the_readme_describes():
    names = set(_every_submodule())
    for folder in ("launcher", "tracing", "exercises", "sim", "fsdp"):
        assert f"ddp_teach.{folder}" in names
    assert "ddp_teach.launcher.protocol" in names
    checkers = [n for n in names if n.startswith("ddp_teach.exercises.nb")]
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9A][0-9]_*.ipynb"))
    # checkers in a module named after their notebook (nbNN_<notebook>), and
    # a second one, nbNN_<topic>, only beside it, when one would be too long
    by_number = {notebook[:2]: notebook for notebook in notebooks}
    for checker in checkers:
        name = checker.removeprefix("ddp_teach.exercises.nb")
        main = f"ddp_teach.exercises.nb{by_number.get(name[:2], '?')}"
        assert name in notebooks or main in names, checker


def test_every_submodule_imports_first_in_a_fresh_interpreter():
    """Each module imported first, with no ddp_teach module loaded before it
    (torch stays loaded: it is what takes seconds, and it cannot cycle)."""
    script = (
        "import importlib, sys\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] == 'ddp_teach']:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n")
    done = subprocess.run([sys.executable, "-c", script, *_every_submodule()],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr


# The lessons' own implementations. The simulator (ddp_teach.sim) is an
# instrument the lessons use; it never imports one of them, so that changing
# a lesson cannot change what the simulator predicts for it, and the
# simulator can be read, tested and calibrated without the course.
LESSON_MODULES = (
    "ddp", "dp", "zero", "fsdp", "collectives", "paramserver", "pipeline",
    "tensor_parallel", "dtensor_traffic", "checkpoint", "scripts", "slurm", "syncbn", "sampler", "amp",
    "precision", "memory", "flat", "models", "widgets", "diagrams", "launcher",
    "exercises")
# What the lessons and the simulator both build on: leaves, importing no
# module of ddp_teach.
SHARED_MODULES = ("cost", "buckets")
# The modules that hold the simulator's evidence, or exist to compare it with
# the evidence (ddp_teach/sim/evidence/): loaded when first asked for, never by
# `import ddp_teach`; dt.sim gives them by these names.
EVIDENCE_MODULES = ("published", "benchmark_figures", "gpu_surveys", "measurement")


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Which modules of `package` (a folder under `root`) each one imports,
    from every import statement at ANY depth: module level, inside functions
    and methods, under `if` or `try`. An import inside a function runs later
    than one at the top, but it still ties the two modules together: a cycle
    through it fails the day the function runs during an import.

    An edge is an import that NAMES a module: `import a.b`, `from a.b import
    c` (a.b; or a.b.c when that is a module), `from . import c`. Python also
    runs every parent package's __init__ before a submodule (importing
    ddp_teach.sim.model.simulation runs ddp_teach/__init__ and ddp_teach/sim/
    __init__ first); those implied imports are not edges. If they were,
    every module would import ddp_teach, which imports every lesson, and
    everything would be one cycle. So this, and only this, is allowed: a
    package's __init__ importing its own submodules (an edge P -> P.x)
    although asking for P.x runs P's __init__ first. That cannot loop:
    P's __init__ loads P.x whole, and the request then finds it loaded. It
    loops only when P.x needs a name that P's __init__ has not defined yet,
    and for that P.x must name P (`from ddp_teach.sim import Simulation`
    inside ddp_teach.sim.schedules.predict): an edge back, which counts, and a cycle."""
    modules = {".".join(p.relative_to(root).with_suffix("").parts)
               .removesuffix(".__init__"): p for p in (root / package).rglob("*.py")}
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = ".".join(here.split(".")[:len(here.split(".")) - node.level + 1])
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def import_cycles(root: Path, package: str) -> list[list[str]]:
    """Cycles in `import_graph(root, package)`, each as the path that closes
    it. Since a package's __init__ runs first whatever a learner imports,
    which module comes first cannot hide a cycle from this check, as it can
    from the fresh-interpreter test above."""
    graph = import_graph(root, package)
    cycles, state = [], {}

    def visit(name, path):
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[name] = "done"
    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


def course_imports_of_the_simulator(root: Path, package: str) -> list[str]:
    """'sim module -> course module' for every lesson's module that a module
    of `package`.sim imports, directly or through other modules (the
    package's top __init__, which imports everything, counts too: naming it
    is importing every lesson)."""
    graph = import_graph(root, package)
    course = {f"{package}.{name}" for name in LESSON_MODULES}
    found = []
    for name in sorted(graph):
        if name != f"{package}.sim" and not name.startswith(f"{package}.sim."):
            continue
        seen, stack = set(), list(graph[name])
        while stack:
            target = stack.pop()
            if target in seen:
                continue
            seen.add(target)
            if target in course or target.rpartition(".")[0] in course:
                found.append(f"{name} -> {target}")
            elif target != package:
                stack.extend(graph[target])
            else:
                found.append(f"{name} -> {package} (every lesson)")
    return found


def test_no_import_cycle_counting_imports_inside_functions():
    assert import_cycles(ROOT, "ddp_teach") == []


def test_the_simulator_imports_no_lesson():
    assert course_imports_of_the_simulator(ROOT, "ddp_teach") == []


def test_the_modules_both_layers_share_import_nothing_of_the_package():
    """cost.py (the alpha-beta model) and buckets.py (DDP's bucket rule) are
    what the course and the simulator share; importing a lesson from them
    would bring the lesson back into the simulator."""
    graph = import_graph(ROOT, "ddp_teach")
    assert {name: graph[f"ddp_teach.{name}"] for name in SHARED_MODULES} == {
        name: set() for name in SHARED_MODULES}


def test_a_planted_import_cycle_is_found(tmp_path):
    """The check above can fail: zero.py and fsdp.py importing each other,
    as they once did, is a cycle; so is a submodule importing a name from
    its own package inside a function, when the package imports it."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from pkg import zero\n")
    (tmp_path / "pkg" / "zero.py").write_text(
        "def helper(): pass\nfrom pkg.fsdp import FSDP  # noqa: E402\n")
    (tmp_path / "pkg" / "fsdp.py").write_text(
        "from pkg.zero import helper\n\ndef later():\n    import os\n")
    assert import_cycles(tmp_path, "pkg") == [["pkg.zero", "pkg.fsdp", "pkg.zero"]]
    (tmp_path / "pkg" / "fsdp.py").write_text(
        "def later():\n    from pkg import FSDP\n")
    assert import_cycles(tmp_path, "pkg") == [["pkg", "pkg.zero", "pkg.fsdp", "pkg"]]


def test_a_planted_lesson_import_in_the_simulator_is_found(tmp_path):
    """A lesson reached through another module, by a relative import inside
    a function, is found."""
    (tmp_path / "pkg" / "sim").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sim" / "__init__.py").write_text("from pkg.sim import model\n")
    (tmp_path / "pkg" / "sim" / "model.py").write_text(
        "def f():\n    from .. import neutral\n")
    (tmp_path / "pkg" / "neutral.py").write_text("from pkg.ddp import MIB\n")
    (tmp_path / "pkg" / "ddp.py").write_text("MIB = 2 ** 20\n")
    assert course_imports_of_the_simulator(tmp_path, "pkg") == [
        "pkg.sim -> pkg.ddp", "pkg.sim.model -> pkg.ddp"]


def test_import_ddp_teach_loads_no_evidence():
    """The published measurements (the evidence files, their loader, and
    the modules that compare the simulator with them) load when a notebook
    first asks for them."""
    done = subprocess.run(
        [sys.executable, "-c", "import ddp_teach, sys; "
         "print([m for m in sys.modules if m.startswith('ddp_teach.sim.evidence')])"],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"import ddp_teach loaded {done.stdout}"
    # ... and they are still there when asked for
    for name in EVIDENCE_MODULES + ("evidence",):
        assert name in dir(dt.sim)
    for name in EVIDENCE_MODULES:
        assert getattr(dt.sim, name).__name__ == f"ddp_teach.sim.evidence.{name}"
    assert dt.sim.evidence.__name__ == "ddp_teach.sim.evidence"


# the course authors' notes beside the repository, which a learner's clone
# lacks; spelled in pieces so that this file does not name them itself
OUTSIDE_PATHS = ("/".join(("shared", "reference")), "/".join(("shared", "seeds")),
                 ".".join(("design", "md")))


def test_no_file_cites_a_path_outside_the_repository():
    cited = []
    for path in ROOT.rglob("*"):
        if (path.suffix in {".py", ".md", ".ipynb", ".toml", ".yml"}
                and not {".venv", ".git", ".jupyter", "build"} & set(path.parts)):
            text = path.read_text(errors="replace")
            for marker in OUTSIDE_PATHS:
                if marker in text:
                    cited.append(f"{path.relative_to(ROOT)}: {marker}")
    assert not cited, cited


# The simulator's layers, lowest first: a module imports only from its own
# layer or a lower one (the model knows nothing of the runtime that charges
# its times, the runtime nothing of the schedules, nothing of the evidence).
SIM_LAYERS = ("model", "runtime", "schedules", "evidence")


def test_the_simulators_layers_import_one_way():
    graph = import_graph(ROOT, "ddp_teach")

    def layer(name):
        parts = name.split(".")
        return SIM_LAYERS.index(parts[2]) if len(parts) > 3 and parts[2] in SIM_LAYERS \
            else None
    upward = [f"{source} -> {target}" for source, targets in graph.items()
              for target in targets
              if layer(source) is not None and layer(target) is not None
              and layer(target) > layer(source)]
    assert upward == []
    assert {layer(name) for name in graph} >= set(range(len(SIM_LAYERS)))
