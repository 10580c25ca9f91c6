"""The course as a learner sees it: JupyterLab in a real (headless) Chromium.

nbval proves that the notebooks execute; these tests prove what the learner
sees in the browser: the notebooks run from JupyterLab's own "Run All Cells"
menu without an error, plots appear as pictures, a slider re-runs its
experiment, the output of four ranks stays readable, a failing rank shows
up in the cell with its rank and its remote traceback, and `dt.progress`
draws a bar per rank that advances while the ranks run.

JupyterLab is started with `make lab`, as a learner does, on a free port of
127.0.0.1 with a token, over a copy of notebooks/ (so that autosave never
touches the course) and with a fresh workspace and settings folder. Chromium
is Debian's `chromium`, driven through Selenium by its `chromedriver`
(`make browser` installs both); without them the tests are skipped, or fail
where DDP_TEACH_REQUIRE_BROWSER=1 (as in .ci/run). Screenshots are saved in
build/browser/.
"""
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "build" / "browser"
NOTEBOOK_TIMEOUT_S = 240   # Run All of one notebook; 03 takes ~20 s here
# Settings a fresh JupyterLab asks about in a pop-up that would cover the
# screenshots (and it would try to reach the internet for news).
QUIET_SETTINGS = {"@jupyterlab/apputils-extension/notification":
                  {"fetchNews": "false", "checkForUpdates": False}}

pytestmark = pytest.mark.timeout(480)


def browser_paths() -> tuple[str, str]:
    """Chromium and chromedriver, or skip (fail under CI) saying why."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    message = ("Chromium and chromedriver are not installed: `make browser` "
               "installs Debian's chromium and chromium-driver with apt-get "
               "(as root or with sudo)")
    if os.environ.get("DDP_TEACH_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{message}; DDP_TEACH_REQUIRE_BROWSER=1 makes that a failure")
    pytest.skip(f"{message}; the browser tests are skipped")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab started by `make lab`; `url(path)` adds the token."""

    def __init__(self, tmp: Path):
        self.root = tmp / "notebooks"
        shutil.copytree(ROOT / "notebooks", self.root,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        for name, values in QUIET_SETTINGS.items():
            path = tmp / "settings" / f"{name}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        self.token = secrets.token_hex(16)
        self.port = free_port()
        env = os.environ | {"JUPYTER_TOKEN": self.token,
                            "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
                            "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces")}
        self.log = tmp / "lab.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["make", "--no-print-directory", "-C", str(ROOT), "lab",
                 f"LAB_ROOT={self.root}",
                 f"LAB_ARGS=--no-browser --port={self.port} "
                 "--ServerApp.port_retries=0"],
                env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.wait_until_up()
        except BaseException:
            self.stop()
            raise

    def url(self, path: str = "/") -> str:
        separator = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}{path}{separator}token={self.token}"

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", method=method,
            headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read()

    def wait_until_up(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"`make lab` exited:\n{self.log.read_text()}")
            try:
                self.api("/api/status")
                return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"JupyterLab did not answer:\n{self.log.read_text()}")

    def stop(self) -> None:
        """Shut the server down as its menu would (kernels, their fork
        servers and workers go with it); kill whatever is left after that."""
        try:
            family = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        try:
            self.api("/api/shutdown", method="POST")
            self.process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.process.wait()
        _, alive = psutil.wait_procs(family, timeout=10)
        for process in alive:
            process.kill()
        psutil.wait_procs(alive, timeout=10)

    def signal_group(self, sig) -> None:
        try:
            os.killpg(self.process.pid, sig)   # make and the server it started
        except ProcessLookupError:
            pass


@pytest.fixture
def lab(tmp_path):
    browser_paths()   # skip before starting anything
    server = Lab(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def browser(tmp_path, lab):
    chromium, chromedriver = browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1400,1000",
                f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    service = Service(chromedriver, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.implicitly_wait(0)
    yield Page(driver, lab)
    driver.quit()


# ---- reading JupyterLab's page ----------------------------------------------

# The notebook in the current main-area tab: its name, its code cells (prompt,
# and each output's MIME type, text and pictures) and the kernel's status.
NOTEBOOK_STATE_JS = """
const tab = document.querySelector('#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current');
const panel = tab && document.getElementById(tab.dataset.id);
if (!panel || !panel.querySelector('.jp-Notebook')) return null;
const status = document.querySelector('#jp-main-statusbar');
return {
  name: tab.querySelector('.lm-TabBar-tabLabel').textContent,
  kernel: status ? status.textContent : '',
  cells: [...panel.querySelectorAll('.jp-CodeCell')].map(cell => ({
    // a cell whose input is collapsed (the course's checks) shows a
    // placeholder instead of its input area, and with it no prompt
    prompt: (cell.querySelector('.jp-InputArea-prompt') || {textContent: ''})
      .textContent.trim(),
    collapsed: !cell.querySelector('.jp-InputArea-prompt'),
    outputs: [...cell.querySelectorAll(
        '.jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output')]
      .map(out => ({
        mime: out.dataset.mimeType || '',
        text: out.textContent,
        images: [...out.querySelectorAll('img')].map(
            img => [img.src.slice(0, 22), img.naturalWidth]),
      })),
  })),
};
"""


class Page:
    """A browser tab on the Lab, with the few gestures a learner makes."""

    def __init__(self, driver, lab: Lab):
        self.driver, self.lab = driver, lab

    def open(self, path: str) -> None:
        self.driver.get(self.lab.url(path))

    def state(self):
        return self.driver.execute_script(NOTEBOOK_STATE_JS)

    def wait(self, condition, timeout: float, what: str):
        from selenium.common.exceptions import StaleElementReferenceException
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = condition()
            except StaleElementReferenceException:
                value = None  # the page redrew what the condition held: look again
            if value:
                return value
            time.sleep(0.25)
        self.screenshot("timed_out")
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; "
                             f"last state: {str(self.state())[:3000]}")

    def wait_for_notebook(self, name: str, code_cells: int):
        """The notebook's tab is current, every cell is on the page and its
        kernel is idle."""
        def ready():
            s = self.state()
            return (s and s["name"] == name and len(s["cells"]) == code_cells
                    and "| Idle" in s["kernel"]) and s
        return self.wait(ready, 120, f"{name} to open with an idle kernel")

    def menu(self, menu: str, item: str) -> None:
        from selenium.webdriver.common.by import By
        self.driver.find_element(
            By.XPATH, f"//div[contains(@class, 'lm-MenuBar-itemLabel')]"
                      f"[text()='{menu}']").click()
        self.wait(lambda: self.driver.find_elements(
            By.XPATH, f"//li[contains(@class, 'lm-Menu-item')]"
                      f"[.//div[text()='{item}']]"), 10, f"menu item {item}")[0].click()

    def run_all(self, timeout: float = NOTEBOOK_TIMEOUT_S):
        """Run > Run All Cells, then wait until no cell is queued or running
        ([*]) and the kernel is idle again. Returns the page's state."""
        started = time.monotonic()
        self.menu("Run", "Run All Cells")

        def finished():
            s = self.state()
            prompts = [cell["prompt"] for cell in s["cells"]]
            return ("[*]:" not in prompts and "| Idle" in s["kernel"]
                    and any(re.fullmatch(r"\[\d+\]:", p) for p in prompts)) and s
        state = self.wait(finished, timeout, "Run All Cells to finish")
        print(f"{state['name']}: Run All Cells took {time.monotonic() - started:.0f} s")
        return state

    def save(self, path: Path) -> None:
        """File > Save Notebook; wait until the tab is no longer dirty."""
        self.menu("File", "Save Notebook")
        self.wait(lambda: not self.driver.execute_script(
            "return document.querySelector('#jp-main-dock-panel "
            ".lm-TabBar-tab.lm-mod-current.jp-mod-dirty')"), 30, f"{path.name} saved")

    def scroll_to(self, element) -> None:
        self.driver.execute_script(
            "arguments[0].scrollIntoView({block: 'center'});", element)
        time.sleep(0.5)   # let JupyterLab lay out what scrolled into view

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.driver.save_screenshot(str(path))
        print(f"screenshot: {path}")
        return path

    def code_cells(self):
        from selenium.webdriver.common.by import By
        tab = self.driver.find_element(
            By.CSS_SELECTOR, "#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current")
        panel = self.driver.find_element(By.ID, tab.get_attribute("data-id"))
        return panel.find_elements(By.CSS_SELECTOR, ".jp-CodeCell")


def code_cell_count(path: Path) -> int:
    nb = nbformat.read(path, as_version=4)
    return sum(cell.cell_type == "code" for cell in nb.cells)


# JupyterLab renders an exception like text on stderr (both are
# application/vnd.jupyter.stderr on the page); IPython's header tells them apart.
EXCEPTION_HEADER = re.compile(r"^-{20,}\n\S+ +Traceback \(most recent call last\)")


def errors_in(state) -> list[str]:
    """Each exception shown in a cell, with the cell's index and prompt."""
    return [f"cell {i} ({cell['prompt']}): {out['text']}"
            for i, cell in enumerate(state["cells"]) for out in cell["outputs"]
            if out["mime"] == "application/vnd.jupyter.stderr"
            and EXCEPTION_HEADER.match(out["text"])]


def saved_errors(path: Path) -> list[str]:
    """The same, from the notebook as JupyterLab saved it, and every code
    cell that did not run (the page shows no prompt for a collapsed one)."""
    nb = nbformat.read(path, as_version=4)
    return [f"cell {i}: {out.ename}: {out.evalue.splitlines()[0]}"
            for i, cell in enumerate(nb.cells) for out in cell.get("outputs", [])
            if out.output_type == "error"] + [
        f"cell {i} did not run: {cell.source[:60]!r}" for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and cell.execution_count is None]


def open_new_notebook(browser, name: str, sources: list[str]) -> None:
    """A learner's own notebook of these code cells, opened in the Lab."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nbformat.write(nb, browser.lab.root / name)
    browser.open(f"/lab/tree/{name}")
    browser.wait_for_notebook(name, len(sources))


def assert_every_cell_ran(state) -> None:
    """Every cell whose prompt the page shows has a number in it (the
    collapsed ones are checked in the saved notebook: `saved_errors`)."""
    not_run = [i for i, cell in enumerate(state["cells"])
               if not cell["collapsed"] and not re.fullmatch(r"\[\d+\]:", cell["prompt"])]
    assert not not_run, f"code cells that did not run: {not_run}"


# ---- the tests --------------------------------------------------------------

def test_make_lab_opens_on_the_welcome_notebook_and_it_runs_clean(browser):
    """`make lab`'s front page is 00_welcome; Run All Cells leaves no error
    in any cell, and the per-rank lines carry their [rank r] prefix."""
    browser.open("/")   # what the link `make lab` prints leads to
    state = browser.wait_for_notebook(
        "00_welcome.ipynb", code_cell_count(ROOT / "notebooks/00_welcome.ipynb"))
    assert "/lab/tree/00_welcome.ipynb" in browser.driver.current_url
    browser.screenshot("00_welcome_landing")

    state = browser.run_all()
    assert_every_cell_ran(state)
    assert errors_in(state) == []
    browser.save(browser.lab.root / "00_welcome.ipynb")
    assert saved_errors(browser.lab.root / "00_welcome.ipynb") == []
    # The chatty cell: each rank's three lines, prefixed, in the rank's order.
    chatty = next(cell for cell in state["cells"]
                  if "[rank 0] step 0" in "".join(o["text"] for o in cell["outputs"]))
    lines = "".join(o["text"] for o in chatty["outputs"]).splitlines()
    for rank in (0, 1):
        assert [line for line in lines if line.startswith(f"[rank {rank}]")] == \
            [f"[rank {rank}] step {step}" for step in range(3)]
    index = next(i for i, c in enumerate(state["cells"]) if c is chatty)
    browser.scroll_to(browser.code_cells()[index])
    browser.screenshot("00_welcome_rank_output")


def test_ddp_notebook_shows_plots_and_its_slider_reruns_the_experiment(browser):
    """03_ddp runs clean, its timelines appear as pictures, and moving the
    bucket-cap slider then pressing Run Interact re-runs the traced step
    with the new cap and redraws the timeline."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.open("/lab/tree/03_ddp.ipynb")
    browser.wait_for_notebook(
        "03_ddp.ipynb", code_cell_count(ROOT / "notebooks/03_ddp.ipynb"))
    state = browser.run_all()
    assert_every_cell_ran(state)
    assert errors_in(state) == []
    browser.save(browser.lab.root / "03_ddp.ipynb")
    assert saved_errors(browser.lab.root / "03_ddp.ipynb") == []
    plots = [(i, image) for i, cell in enumerate(state["cells"])
             for out in cell["outputs"] for image in out["images"]]
    assert plots, "no picture in any output"
    assert all(src == "data:image/png;base64," and width > 0
               for _, (src, width) in plots), plots
    browser.scroll_to(browser.code_cells()[plots[0][0]]
                      .find_element(By.CSS_SELECTOR, ".jp-OutputArea-output img"))
    browser.screenshot("03_ddp_timeline")

    interact = browser.driver.find_element(By.CSS_SELECTOR, ".widget-interact")
    browser.scroll_to(interact)
    button = interact.find_element(By.XPATH, ".//button[text()='Run Interact']")
    cap = interact.find_element(By.CSS_SELECTOR, ".widget-slider")
    readout = cap.find_element(By.CSS_SELECTOR, ".widget-readout")
    assert cap.find_element(By.CSS_SELECTOR, "label").text == "cap MiB"

    def plot_in_widget(not_this=None):
        images = interact.find_elements(By.CSS_SELECTOR, ".widget-output img")
        src = images and images[0].get_attribute("src")
        return src if src and src != not_this else None

    button.click()
    first = browser.wait(plot_in_widget, 60, "the widget's first plot")
    assert readout.text == "1"
    cap.find_element(By.CSS_SELECTOR, ".noUi-handle").send_keys(Keys.ARROW_RIGHT)
    browser.wait(lambda: readout.text == "2", 10, "the slider to move to 2")
    button.click()
    second = browser.wait(lambda: plot_in_widget(not_this=first), 60,
                          "the plot to be redrawn for the new cap")
    assert second.startswith("data:image/png;base64,")
    assert len(interact.find_elements(By.CSS_SELECTOR, ".widget-output img")) == 1
    browser.scroll_to(interact)
    browser.screenshot("03_ddp_widget")


SCRATCH = [
    # which kernel: the one of this repository's .venv, as `make lab` sets up
    "import sys, time\nimport ddp_teach as dt\nprint(sys.executable)",
    # four ranks printing at once
    "def count(rank, world_size):\n"
    "    for step in range(5):\n"
    "        print(f'step {step} of rank {rank}', flush=True)\n"
    "        time.sleep(0.01)\n"
    "    return rank\n\n"
    "dt.run(count, world_size=4)",
    # a widget whose sliders redraw on every move
    "dt.widgets.zero_calculator(7.5e9, world_size=64, stage=3)",
    # last, since Run All stops at an error
    "def fails_on_rank_1(rank, world_size):\n"
    "    if rank == 1:\n"
    "        raise ValueError('planted failure on rank 1')\n"
    "    time.sleep(2)\n"
    "    return rank\n\n"
    "dt.run(fails_on_rank_1, world_size=2)",
]


def test_four_ranks_a_moving_slider_and_a_failing_rank(browser):
    """A learner's own notebook: the kernel is the repository's .venv, four
    ranks' output is prefixed and each rank's lines keep their order, the
    ZeRO calculator redraws when its slider moves, and a rank that raises
    shows its rank and remote traceback in the cell."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    open_new_notebook(browser, "scratch.ipynb", SCRATCH)
    state = browser.run_all()
    kernel_cell, ranks_cell, calculator_cell, failing_cell = state["cells"]

    executable = kernel_cell["outputs"][0]["text"].strip()
    assert Path(executable).parent == ROOT / ".venv" / "bin", executable

    printed = "".join(o["text"] for o in ranks_cell["outputs"]
                      if o["mime"] == "application/vnd.jupyter.stdout")
    lines = [line for line in printed.splitlines() if line.startswith("[rank")]
    assert len(lines) == 20, printed
    for line in lines:   # every line whole, under its own rank's prefix
        rank = re.fullmatch(r"\[rank (\d)\] step \d of rank (\d)", line)
        assert rank and rank[1] == rank[2], line
    for rank in range(4):
        assert [line for line in lines if line.startswith(f"[rank {rank}]")] == \
            [f"[rank {rank}] step {s} of rank {rank}" for s in range(5)]
    assert "[0, 1, 2, 3]" in ranks_cell["outputs"][-1]["text"]
    cells = browser.code_cells()
    browser.scroll_to(cells[1])
    browser.screenshot("scratch_four_ranks")

    calculator = cells[2].find_element(By.CSS_SELECTOR, ".widget-vbox")
    devices = next(s for s in calculator.find_elements(By.CSS_SELECTOR, ".widget-slider")
                   if s.find_element(By.CSS_SELECTOR, "label").text == "devices")

    def summary():
        return calculator.find_element(By.CSS_SELECTOR, ".widget-output").text

    assert "Nd = 64 devices" in summary()
    picture = browser.wait(lambda: calculator.find_elements(
        By.CSS_SELECTOR, ".widget-output img"), 20, "the calculator's bars")
    before = picture[0].get_attribute("src")
    browser.scroll_to(calculator)
    devices.find_element(By.CSS_SELECTOR, ".noUi-handle").send_keys(Keys.ARROW_RIGHT)
    browser.wait(lambda: "Nd = 128 devices" in summary(), 20,
                 "the calculator's summary for 128 devices")

    def new_picture():
        pictures = calculator.find_elements(By.CSS_SELECTOR, ".widget-output img")
        return pictures and pictures[0].get_attribute("src") != before
    browser.wait(new_picture, 20, "the calculator's bars for 128 devices")
    browser.screenshot("scratch_zero_calculator")

    errors = errors_in({"cells": [failing_cell]})
    assert len(errors) == 1, failing_cell
    shown = errors[0]
    assert "WorkerError" in shown
    assert "rank 1 failed with ValueError: planted failure on rank 1" in shown
    assert "Traceback from rank 1" in shown
    assert "raise ValueError('planted failure on rank 1')" in shown  # remote line
    assert len(errors_in(state)) == 1   # no other cell failed
    browser.save(browser.lab.root / "scratch.ipynb")
    assert saved_errors(browser.lab.root / "scratch.ipynb") == [
        "cell 3: WorkerError: rank 1 failed with ValueError: "
        "planted failure on rank 1"]   # the cell's error, as an error output
    browser.scroll_to(cells[3])
    browser.screenshot("scratch_failing_rank")


PROGRESS_CELLS = [
    "import time\nimport ddp_teach as dt",
    "def slow_steps(rank, world_size):\n"
    "    for step in range(1, 9):\n"
    "        time.sleep(0.6)\n"
    "        dt.progress(step, 8, loss=1.0 / step)\n"
    "    return rank\n\n"
    "dt.run(slow_steps, world_size=2)",
]


def test_progress_bars_appear_and_advance_while_the_ranks_run(browser):
    """dt.progress in a learner's run: one bar per rank shows up in the cell
    while it runs, its label's step grows, and it ends at the last step."""
    from selenium.webdriver.common.by import By

    open_new_notebook(browser, "progress.ipynb", PROGRESS_CELLS)
    browser.menu("Run", "Run All Cells")

    def steps_shown():
        """The step each rank's bar reports, once both bars are drawn."""
        cell = browser.code_cells()[1]
        bars = cell.find_elements(By.CSS_SELECTOR, ".widget-hprogress")
        labels = [label.text for label in cell.find_elements(
            By.CSS_SELECTOR, ".widget-label")]
        steps = [int(m[1]) for m in (re.match(r"(\d+)/8", t) for t in labels) if m]
        return len(bars) == 2 and len(steps) == 2 and steps
    first = browser.wait(steps_shown, 60, "two progress bars with their steps")
    browser.screenshot("progress_bars_running")
    assert max(first) < 8, first   # seen while the ranks still run
    browser.wait(lambda: (steps_shown() or [0])[0] > first[0], 30,
                 "rank 0's bar to advance")
    browser.wait(lambda: steps_shown() == [8, 8], 60, "both bars at step 8 of 8")
    labels = " ".join(label.text for label in browser.code_cells()[1].find_elements(
        By.CSS_SELECTOR, ".widget-label"))
    assert "8/8 loss 0.125" in labels, labels   # (the page folds double spaces)
    printed = browser.code_cells()[1].text
    assert "\x1e" not in printed and "ddp_teach progress" not in printed
    browser.screenshot("progress_bars_done")
