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
    ("debugging.ReplicaWatch", "class"),
    ("debugging.compare_replicas", "function"),
    ("debugging.nonfinite_ranks", "function"),
    ("debugging.FirstNonFinite", "class"),
    ("lm.stdlib_corpus", "function"), ("lm.CharVocab", "class"),
    ("lm.TinyGPT", "class"), ("lm.batch_for_step", "function"),
    ("lm.next_token_loss", "function"), ("lm.unigram_entropy", "function"),
    ("lm.generate", "function"),
    ("models.reference_mlp", "function"),
    ("system.describe", "function"), ("system.cpu_cores", "function"),
    ("system.gpu_count", "function"), ("system.choose_backend", "function"),
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


def import_cycles(root: Path, package: str) -> list[list[str]]:
    """Cycles among the modules of `package` (a folder under `root`), from the
    imports that run when a module is imported (not those inside functions).
    A package's __init__ always runs first, so which module a learner imports
    first cannot hide a cycle from this check, as it can from the one above."""
    modules = {".".join(p.relative_to(root).with_suffix("").parts)
               .removesuffix(".__init__"): p for p in (root / package).rglob("*.py")}
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in _import_time_nodes(ast.parse(path.read_text())):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [f"{node.module}.{a.name}" if f"{node.module}.{a.name}"
                             in modules else node.module for a in node.names]
                       if node.module and node.level == 0 else [])
            graph[name] |= {t for t in targets if t in modules and t != name}
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


def _import_time_nodes(tree):
    """Import statements outside function bodies."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stack.extend(ast.iter_child_nodes(node))


def test_no_module_imports_a_module_that_imports_it_back():
    assert import_cycles(ROOT, "ddp_teach") == []


def test_a_planted_import_cycle_is_found(tmp_path):
    """The check above can fail: zero.py and fsdp.py importing each other,
    as they once did, is a cycle."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from pkg import zero\n")
    (tmp_path / "pkg" / "zero.py").write_text(
        "def helper(): pass\nfrom pkg.fsdp import FSDP  # noqa: E402\n")
    (tmp_path / "pkg" / "fsdp.py").write_text(
        "from pkg.zero import helper\n\ndef later():\n    import os\n")
    assert import_cycles(tmp_path, "pkg") == [["pkg.zero", "pkg.fsdp", "pkg.zero"]]


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
