"""Read the evidence files (`ddp_teach/sim/evidence/*.toml`) when asked.

Each file holds rows of published measurements; `manifest.toml` lists the
files, says what every field means and holds the sources the rows cite by
key. `rows` gives a file's rows as `Row`s, checked on reading (a field
missing, a role or group misspelt, an id used twice, a source not in the
manifest: each a ValueError naming the file and the row). `measurements`
binds rows to the functions that simulate them, by the name in each row's
`simulate.figure`, giving the `measurement.Measurement`s that validation
tables are built from. The files are read with the standard library's
tomllib (Python 3.11+) and kept once read.
"""
import functools
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Callable

from ddp_teach.sim.evidence.measurement import Measurement

GROUPS = ("collective", "kernel", "training", "inference")
ROLES = ("calibrate", "validate")
REQUIRED = ("id", "group", "what", "config", "figure", "unit", "source", "role",
            "simulate")
OPTIONAL = ("note",)


@dataclass(frozen=True)
class Row:
    """One published measurement as its file holds it. source: the citation
    (the manifest's text for the row's key, `source_key`); simulate: the
    function's name (`simulate["figure"]`) and its keyword arguments;
    extra: any other field the row carries (the capstone step's phases)."""
    id: str
    group: str
    what: str
    config: str
    figure: float
    unit: str
    source: str
    source_key: str
    role: str
    simulate: dict
    note: str = ""
    extra: dict = field(default_factory=dict)


def _read(name: str) -> dict:
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"ddp_teach/sim/evidence/{name} is not valid TOML: {error}") \
            from None


@functools.cache
def manifest() -> dict:
    """The manifest: `files` (in the validation table's order),
    `package_files` (those the package simulates itself) and `sources`."""
    return _read("manifest.toml")


def source(key: str) -> str:
    """The citation the manifest holds for a source `key`."""
    sources = manifest()["sources"]
    if key not in sources:
        raise KeyError(f"no source {key!r} in ddp_teach/sim/evidence/manifest.toml; "
                       f"known: {', '.join(sorted(sources))}")
    return sources[key]


def parse_row(name: str, index: int, fields: dict) -> Row:
    """The `index`-th row of evidence file `name`, from its TOML `fields`,
    checked (a ValueError names the file, the row and what is wrong)."""
    where = f"ddp_teach/sim/evidence/{name}, row {index + 1} ({fields.get('id', 'no id')})"
    missing = [f for f in REQUIRED if f not in fields]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}: every row needs "
                         f"{', '.join(REQUIRED)} (manifest.toml says what each means)")
    if fields["group"] not in GROUPS:
        raise ValueError(f"{where}: group {fields['group']!r} is not one of {GROUPS}")
    if fields["role"] not in ROLES:
        raise ValueError(f"{where}: role {fields['role']!r} is not one of {ROLES}")
    figure = fields["figure"]
    if isinstance(figure, bool) or not isinstance(figure, (int, float)) or not figure > 0:
        raise ValueError(f"{where}: figure must be a number > 0; got {figure!r}")
    if "figure" not in fields["simulate"]:
        raise ValueError(f"{where}: simulate needs `figure`, the name of the function "
                         "that simulates the row")
    try:
        citation = source(fields["source"])
    except KeyError as error:
        raise ValueError(f"{where}: {error.args[0]}") from None
    extra = {k: v for k, v in fields.items() if k not in REQUIRED + OPTIONAL}
    return Row(fields["id"], fields["group"], fields["what"], fields["config"],
               float(figure), fields["unit"], citation, fields["source"],
               fields["role"], dict(fields["simulate"]), fields.get("note", ""), extra)


@functools.cache
def rows(name: str) -> tuple:
    """The rows of the evidence file `name` (one of the manifest's `files`)."""
    if name not in manifest()["files"]:
        raise ValueError(f"{name!r} is not an evidence file; the manifest lists "
                         f"{manifest()['files']}")
    result = tuple(parse_row(name, i, fields) for i, fields in enumerate(_read(name)["row"]))
    twice = _repeated_ids(result)
    if twice:
        raise ValueError(f"ddp_teach/sim/evidence/{name}: ids used twice: {twice}")
    return result


def every_row() -> list:
    """Every row of every file, in the manifest's order (ids unique over all)."""
    result = [row for name in manifest()["files"] for row in rows(name)]
    twice = _repeated_ids(result)
    if twice:
        raise ValueError(f"ids used in two evidence files: {twice}")
    return result


def _repeated_ids(rows_) -> list:
    """The ids that more than one of `rows_` has, sorted."""
    ids = [row.id for row in rows_]
    return sorted({i for i in ids if ids.count(i) > 1})


def by_id() -> dict:
    """{id: Row} over every file."""
    return {row.id: row for row in every_row()}


def measurements(names, simulators: dict[str, Callable[..., float]]) -> list:
    """The rows of the files `names` as `Measurement`s, each simulated by
    `simulators[row.simulate["figure"]]` called with the row's other
    `simulate` keys as keyword arguments."""
    result = []
    for name in names:
        for row in rows(name):
            arguments = dict(row.simulate)
            figure = arguments.pop("figure")
            if figure not in simulators:
                raise ValueError(
                    f"row {row.id!r} of {name} is simulated by {figure!r}, which is not "
                    f"among the functions given ({', '.join(sorted(simulators))}); add "
                    "it, or correct the row's simulate.figure")
            result.append(Measurement(
                row.group, row.what, row.config, row.source, row.figure, row.unit,
                row.role, functools.partial(simulators[figure], **arguments), row.note,
                row.id))
    return result
