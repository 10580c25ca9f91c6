"""`make html` (tools/build_html.py): a notebook is executed, rendered with
its outputs and listed in the index; a cell tagged `raises-exception` may
fail, any other error is reported and fails the build."""
import importlib.util
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("build_html", ROOT / "tools/build_html.py")
build_html = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_html)


def notebook(path: Path, *cells) -> Path:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [nbformat.v4.new_markdown_cell(
        f"# {path.stem} · a title\n\nIts first\nparagraph.\n\nNot this one.")]
    nb.cells += [nbformat.v4.new_code_cell(source, metadata={"tags": tags})
                 for source, tags in cells]
    nbformat.write(nb, path)
    return path


def test_pages_with_outputs_an_index_in_order_and_errors_reported(tmp_path, capsys):
    good = notebook(tmp_path / "00_good.ipynb",
                    ("1 / 0", ["raises-exception"]),   # planted: allowed
                    ("print('printed by 00')", []))
    bad = notebook(tmp_path / "01_bad.ipynb", ("print('before')", []),
                   ("assert False, 'unplanted'", []), ("print('after')", []))
    out = tmp_path / "html"
    assert build_html.main(["--out", str(out), str(bad), str(good)]) == 1

    page = (out / "00_good.html").read_text()
    assert "printed by 00" in page and "ZeroDivisionError" in page
    assert 'href="index.html"' in page and 'href="01_bad.html"' in page  # nav
    assert "before" in (out / "01_bad.html").read_text()  # rendered anyway
    index = (out / "index.html").read_text()
    assert index.index('href="00_good.html"') < index.index('href="01_bad.html"')
    assert "00_good · a title" in index and "Its first paragraph." in index
    assert "Not this one" not in index
    assert "failed: cell 3 (counting from 1): AssertionError: unplanted" in index
    assert index.count("failed:") == 1
    assert "errors in: 01_bad.ipynb" in capsys.readouterr().err
