"""Where a benchmark's report goes.

Each benchmark writes its report, in Markdown, to a file of its own beside
it (`make bench` joins them into results.md) and prints the same text, so
a run read in the terminal and the stored report never differ.
"""
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def publish(filename: str, text: str) -> str:
    """Write `text` to benchmarks/`filename`, print it, and return the path."""
    path = os.path.join(HERE, filename)
    with open(path, "w") as f:
        f.write(text)
    print(text)
    return path


def measure_and_publish(filename: str, measure, report) -> str:
    """Run `measure()`, then publish `report(measured, wall seconds it took)`."""
    started = time.perf_counter()
    measured = measure()
    return publish(filename, report(measured, time.perf_counter() - started))
