"""One-edit mutants of an exercise's reference, to measure its checker.

Each mutant is the reference's own source with one small edit a learner
might make by accident: an integer off by one, a comparison made strict or
loose, == turned into !=, + into -, * into /, `and`, `or` swapped, a call's
first two arguments swapped, a `.wait()` statement dropped (an async
work never waited for), a loop or comprehension run in reversed order. A mutant the checker calls correct is either
equivalent to the reference or a mistake the checker misses, so the share
of mutants rejected is a floor on what the checker catches (the idea of
mutation testing: DeMillo, Lipton and Sayward, "Hints on test data
selection", IEEE Computer 1978).

Used by tests/exercises/test_mutants.py (the in-kernel checkers, cheap)
and tools/exercise_mutants.py (`make test-mutants`: the checkers that start
ranks, a few seconds a mutant).
"""
import ast
import importlib
import inspect
import linecache
import textwrap

from ddp_teach.exercises.registry import CORRECT, Exercise

SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
         ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Add: ast.Sub, ast.Sub: ast.Add,
         ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
         ast.And: ast.Or, ast.Or: ast.And}


def _mutation_sites(tree):
    """(node, what to do to it) for every place one edit can be made in the
    function's body (not its defaults: the checkers pass every argument)."""
    body = tree.body[0].body
    for node in (n for statement in body for n in ast.walk(statement)):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            yield node, "plus one"
            if node.value:
                yield node, "minus one"
        elif isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in SWAPS:
            yield node, "swap operator"
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in SWAPS:
            yield node, "swap comparison"
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            yield node, "swap arguments"
        if isinstance(node, ast.Expr) and _is_wait(node.value):
            yield node, "missing wait"
        elif isinstance(node, (ast.For, ast.comprehension)):
            yield node, "reversed order"


def _is_wait(node) -> bool:
    """`something.wait()` (a Work's or a future's), as a statement."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "wait")


def _mutate(node, how) -> None:
    if how == "plus one":
        node.value += 1
    elif how == "minus one":
        node.value -= 1
    elif how == "swap operator":
        node.op = SWAPS[type(node.op)]()
    elif how == "swap comparison":
        node.ops = [SWAPS[type(node.ops[0])](), *node.ops[1:]]
    elif how == "missing wait":  # the statement stays, as a no-op: `None`
        node.value = ast.Constant(None)
    elif how == "reversed order":  # for x in reversed(list(<iterable>))
        node.iter = ast.Call(ast.Name("reversed", ast.Load()), [
            ast.Call(ast.Name("list", ast.Load()), [node.iter], [])], [])
    else:
        node.args[0], node.args[1] = node.args[1], node.args[0]


def mutants(function):
    """Every one-edit mutant of `function` as (label, function), compiled in
    a copy of its module's globals. Each mutant is a function of "__main__"
    whose source is in linecache, as a notebook cell's is: it travels to
    the workers by value (cloudpickle) and `dt.scripts` writes its own
    source into a script, not an import of the reference."""
    source = textwrap.dedent(inspect.getsource(function))
    count = sum(1 for _ in _mutation_sites(ast.parse(source)))
    module = importlib.import_module(function.__module__)
    for index in range(count):
        tree = ast.parse(source)
        node, how = list(_mutation_sites(tree))[index]
        _mutate(node, how)
        text = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
        filename = f"<mutant {index} of {function.__qualname__}>"
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        namespace = dict(vars(module), __name__="__main__")
        exec(compile(text, filename, "exec"), namespace)
        line = getattr(node, "lineno", None) or node.iter.lineno  # a comprehension has none
        yield f"{how} at line {line}", namespace[function.__name__]


def rejected(exercise: Exercise, mutant) -> bool:
    """True when the exercise's checker does not call `mutant` correct (a
    mutant that crashes the checker counts as rejected: a learner would
    see an error, not a pass)."""
    fn = mutant if exercise.adapt is None else exercise.adapt(mutant)
    try:
        return exercise.checker(fn).status != CORRECT
    except Exception:  # noqa: BLE001 - a crash is a rejection, counted as one
        return True
