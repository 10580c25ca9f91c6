"""Numbers in a notebook's prose that none of its code cells holds.

The course's rule: a number the learner reads in prose is computed and
printed by a cell (and asserted where it is a claim), never typed. A typed
number drifts: the code changes, the machine differs, and the text under a
cell goes on saying what the output no longer says. This finds candidates
for that drift without running anything: it takes every number of the
markdown cells and looks for it among the numbers of the notebook's code
cells. A parameter the code sets (`WORLD = 4`), a bound a cell asserts
(`assert ratio > 1.5`) or a value a cell writes into its printed text is
found there; a measured value typed from an output (`10.6 us`, `x0.94`) is
not, nor is a rounded claim about a printed count ("about 120 thousand").
A fact from outside the course (torch's default 25 MiB bucket cap, a
paper's figure) is allowed by the test's per-notebook list, with its
source.

What is not a claim, and is left out before numbers are taken:
- code spans and fenced code (they are code, not prose), link targets and
  bare URLs, arXiv identifiers, HTML tags;
- a heading's section number ("## 5. DDP"), references by number
  ("section 13", "notebook 03", "notebooks 00 to 07", "exercise 2",
  "§11", "cell 70", "Table 1"), versions ("torch 2.13", "Python 3.11"),
  indices ("rank 0", "ranks 0 and 1", "GPU 3", "step 20") and years;
- names with a digit in them (fp32, H100, ZeRO-3, GPT-2, AVX-512);
- a notebook's study-time line ("Study time: about 2.5 hours"): an
  estimate of the learner's time, not a measurement of the course;
- whole numbers up to 10 with no unit after them ("2 ranks", "4 times
  over" is kept: `times` is a unit): instructions count with them.

    python tools/prose_numbers.py            # every notebook's flags
    python tools/prose_numbers.py 11         # notebook 11's, in context

tests/notebooks/test_prose_numbers.py runs it over every notebook.
"""
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"

SMALL = 10  # whole numbers up to this, with no unit, are counts in instructions

# a number: 6,093 / 467_336 / 10.6 / .5 / 1e-7 / 2.5e6, with × or x before it
NUMBER = re.compile(
    r"(?<![\w.,/:#-])"
    r"(?P<number>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+−]?\d+)?)"
    r"(?P<after>[^\S\n]?(?:%|[A-Za-zµμ×/]+)?)")
# "x0.94", "×8": a factor written before its number
FACTOR_BEFORE = re.compile(r"(?<!\w)[x×](?=\d)")
# words after a number that make it a measurement
UNITS = {
    "%", "x", "×", "times", "fold", "s", "ms", "us", "µs", "μs", "ns",
    "sec", "second", "seconds", "min", "minute", "minutes", "hour", "hours",
    "b", "byte", "bytes", "kb", "kib", "mb", "mib", "gb", "gib", "tb", "tib",
    "bit", "bits", "gb/s", "gbit/s", "mb/s", "tb/s", "flop", "flops",
    "gflop", "tflop", "tflop/s", "tflops", "pflop/s", "tok/s", "tokens/s",
    "nats", "thousand", "million", "billion", "k", "m", "ghz", "w",
}
# what a unit may multiply the number by in the code: "20 ms" is 0.02 s,
# "25 MiB" 25 * 2**20 bytes, "70 B" 70e9 parameters, "45%" 0.45
SCALE = {
    "thousand": [1e3], "million": [1e6], "billion": [1e9], "k": [1e3],
    "m": [1e6], "b": [1e9], "%": [1e-2], "ms": [1e-3], "us": [1e-6],
    "µs": [1e-6], "μs": [1e-6], "ns": [1e-9], "min": [60], "minute": [60],
    "minutes": [60], "hour": [3600], "hours": [3600], "kb": [1e3, 2**10],
    "kib": [2**10], "mb": [1e6, 2**20], "mib": [2**20], "gb": [1e9, 2**30],
    "gib": [2**30], "tb": [1e12, 2**40], "tib": [2**40], "gb/s": [1e9],
    "tb/s": [1e12], "tflop/s": [1e12], "tflops": [1e12], "gflop": [1e9],
    "tflop": [1e12], "pflop/s": [1e15],
}
# words before a number that make it a reference or an index, not a claim
REFERENCE_WORDS = (
    "section", "sections", "§", "notebook", "notebooks", "exercise",
    "exercises", "cell", "cells", "chapter", "part", "table", "figure",
    "fig.", "issue", "pep", "line", "lines", "item", "appendix", "equation",
    "rank", "ranks", "gpu", "device", "devices", "node", "nodes", "worker",
    "workers", "step", "steps", "epoch", "epochs", "layer", "layers",
    "block", "blocks", "bucket", "buckets", "try", "tries", "stage",
    "stages", "level", "iteration", "mistake", "bug", "thread", "threads",
    "port", "shard", "cuda:",
)
JOINERS = r"(?:\s*(?:,|and|or|to|through|-|–|—)\s*)"
REFERENCE = re.compile(
    r"(?i)(?<![\w])(?:" + "|".join(re.escape(w) for w in sorted(
        REFERENCE_WORDS, key=len, reverse=True)) + r")\s*(?:\d+(?:\.\d+)*"
    + JOINERS + r")*\d+(?:\.\d+)*")
# "torch 2.13", "torch before 2.13", "Python 3.11 or later", "CUDA 12"
VERSION = re.compile(
    r"(?i)\b(?P<name>(?:py)?torch|python|cuda|nccl|numpy|version)"
    r"(?P<qualifier>(?:\s+(?:before|after|since|from|older than|newer than|"
    r"up to|>=|<=|<|>))?)\s*\d+(?:\.\d+)*(?:" + JOINERS + r"\d+(?:\.\d+)*)*")
HEADING_NUMBER = re.compile(r"^(#+\s*)\d+(?:\.\d+)*\.?", re.MULTILINE)
STUDY_TIME = re.compile(r"^\**Study time:?\**:?.*$", re.MULTILINE | re.IGNORECASE)
YEAR = re.compile(r"^(?:19[5-9]\d|20[0-3]\d)$")


@dataclass(frozen=True)
class ProseNumber:
    """A number as the prose writes it, where, and what it would mean."""
    text: str           # as written: "10.6", "6,093"
    unit: str           # the word after it, if it is a unit: "us", "%", ""
    values: frozenset   # what it may stand for (45% -> 45 and 0.45)
    cell: int
    context: str        # the line around it

    def found_in(self, code_values: set) -> bool:
        return any(_key(v) in code_values for v in self.values)


def _key(value: float) -> str:
    """A number's identity for matching: 12 significant digits, so that
    0.1 from prose and 0.1 from code compare equal however they were
    written (1e-1, 0.10)."""
    return f"{float(value):.12g}"


def _value(text: str) -> float:
    return float(text.replace(",", "").replace("_", "").replace("−", "-"))


def strip_non_claims(markdown: str) -> str:
    """The prose with what is not a claim blanked out (see the module doc):
    code, links, URLs, references by number, headings' section numbers."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.DOTALL)
    text = STUDY_TIME.sub(" ", text)
    text = re.sub(r"(`+)(?:(?!\1).)+?\1", " ", text, flags=re.DOTALL)
    text = re.sub(r"\]\([^)]*\)", "] ", text)            # link targets
    text = re.sub(r"<[^>\n]+>", " ", text)               # HTML tags, autolinks
    text = re.sub(r"https?://\S+", " ", text)
    text = re.sub(r"(?i)arxiv:\s*\S+|ieee\s*\d+|pcie\s*\d(?:\.\d)?\s*[x×]\s*\d+",
                  " ", text)
    text = VERSION.sub(r"\g<name>\g<qualifier> ", text)
    text = re.sub(r"\d+(?:\.\d+){2,}", " ", text)       # 127.0.0.1, 2.13.0
    text = HEADING_NUMBER.sub(r"\1", text)
    text = FACTOR_BEFORE.sub("× ", text)
    return REFERENCE.sub(" ", text)


# A table cell that lists notebooks only, as the course map's "needs first"
# column does: "| 04, 11 |", "| 00 to 07 |".
NOTEBOOK_LIST_CELL = re.compile(r"\s*\d\d(?:\s*(?:,|to|and)\s*\d\d)*\s*")


def _table_cell(text: str, at: int) -> str:
    """The markdown table cell around position `at`, or "" outside a table."""
    line_start = text.rfind("\n", 0, at) + 1
    line_end = text.find("\n", at)
    line = text[line_start:line_end if line_end >= 0 else None]
    if not line.lstrip().startswith("|"):
        return ""
    left = text.rfind("|", line_start, at)
    right = text.find("|", at)
    return text[left + 1:right] if left >= 0 and right >= 0 else ""


def prose_numbers(markdown: str, cell: int = 0) -> list[ProseNumber]:
    """Every number of a markdown cell that could be a claim."""
    found = []
    cleaned = strip_non_claims(markdown)
    for match in NUMBER.finditer(cleaned):
        text, after = match["number"], match["after"].strip()
        unit = after.lower().rstrip(".,;:)") if after else ""
        multiplied = cleaned[max(0, match.start() - 2):match.start()] == "× "
        if unit not in UNITS:
            unit = "×" if multiplied else ""
        value = _value(text)
        if not unit and "," not in text and YEAR.match(text):
            continue
        if not unit and value == int(value) and abs(value) <= SMALL \
                and "." not in text:
            continue
        if len(text) == 2 and text.startswith("0"):   # "03": a notebook
            continue
        if NOTEBOOK_LIST_CELL.fullmatch(_table_cell(cleaned, match.start())):
            continue                                   # "| 04, 11 |": notebooks
        values = {value, *(value * factor for factor in SCALE.get(unit, []))}
        line_start = cleaned.rfind("\n", 0, match.start()) + 1
        line_end = cleaned.find("\n", match.end())
        context = cleaned[line_start:line_end if line_end >= 0 else None]
        found.append(ProseNumber(text, unit, frozenset(values), cell,
                                 " ".join(context.split())))
    return found


CODE_NUMBER = re.compile(r"(?<![\w.])(\d[\d_]*(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+)")
# a format spec in an f-string, "{x:>8.1f}": its digits are widths, not values
FORMAT_SPEC = re.compile(r":[^{}:'\"\s]?[<>=^]?[+\- ]?#?0?\d*[,_]?(?:\.\d+)?[a-zA-Z%]?}")


def code_values(sources) -> set:
    """Every number written in the code cells (literals, numbers in
    strings and comments), as matching keys; 6_093 and 6093 are one."""
    values = set()
    for source in sources:
        for match in CODE_NUMBER.finditer(FORMAT_SPEC.sub("}", source)):
            try:
                values.add(_key(_value(match[1])))
            except ValueError:
                continue
    return values


def notebook_cells(path) -> list[dict]:
    return json.loads(Path(path).read_text())["cells"]


FURTHER_READING = re.compile(r"^## Further reading", re.MULTILINE)


def prose_cells(cells) -> list[tuple[int, str]]:
    """(index, text) of the markdown cells, up to the further reading: its
    volumes, pages and years are citations, not claims."""
    prose = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        reading = FURTHER_READING.search(text)
        prose.append((index, text[:reading.start()] if reading else text))
        if reading:
            break
    return prose


def untraced_numbers(path) -> list[ProseNumber]:
    """The prose numbers of a notebook that none of its code cells holds."""
    cells = notebook_cells(path)
    known = code_values("".join(c["source"]) for c in cells
                        if c["cell_type"] == "code")
    return [number for index, text in prose_cells(cells)
            for number in prose_numbers(text, index)
            if not number.found_in(known)]


def notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9A][0-9]_*.ipynb"))


def main(argv: list[str]) -> int:
    chosen = [p for p in notebooks() if not argv or p.name[:2] in argv]
    for path in chosen:
        flagged = untraced_numbers(path)
        print(f"{path.stem}: {len(flagged)}")
        for number in flagged:
            print(f"    cell {number.cell:>3}  {number.text}{' ' + number.unit if number.unit else ''}"
                  f"  | {number.context[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
