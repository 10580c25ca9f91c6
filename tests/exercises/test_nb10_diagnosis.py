"""Notebook 11's diagnosis exercise: the reference names every case, rules
written another way that name them all are accepted, and planted wrong
rules (PLANTED, run by test_registry.py) get the hint of the cause they miss."""
import statistics

from ddp_teach.diagnosis import CAUSES, bus_bandwidth, diagnose, step_report
from ddp_teach.exercises import nb10_diagnosis


def test_every_cause_has_cases_on_two_to_five_ranks_and_each_is_named_right():
    cases = nb10_diagnosis.cases()
    assert {c["cause"] for c in cases} == set(CAUSES)
    assert {c["ranks"] for c in cases} <= {2, 3, 4, 5}
    assert all(diagnose(c["run"], c["alone"]) == c["cause"] for c in cases)


def test_every_slow_cause_makes_the_step_longer_than_one_gpus():
    for case in nb10_diagnosis.cases():
        report = step_report(case["run"], case["alone"])
        if case["cause"] == "healthy":
            assert report["vs_one"] < 1.1, case
        else:
            assert report["vs_one"] > 1.0, case


def by_step_report(run, alone):
    """Right, in another style: ratios of step_report and of the ranks'
    compute, with the idle pattern read before the compute's size."""
    rows = list(run.summary().values())
    (one,) = alone.summary().values()
    compute = [r["compute_s"] for r in rows]
    idle = sorted(r["idle_s"] for r in rows)
    if statistics.mean(compute) / one["compute_s"] > 1.5 and \
            max(compute) / min(compute) < 1.1:
        return "same_gpu"
    if max(compute) / min(compute) > 1.3:
        return "straggler"
    if one["idle_s"] > 0.3 * one["span_s"]:
        return "host_bound"
    if idle[0] > 0.2 * one["span_s"]:
        return "starved_loader"
    report = step_report(run, alone)
    if report["overlap"] < 0.05:
        return "no_overlap"
    comm = run.filter(kind="comm", rank=0).events
    if len(comm) >= 30:
        return "buckets_too_small"
    if report["vs_one"] > 1.05 and max(bus_bandwidth(e.nbytes, e.duration, len(rows))
                                       for e in comm) < 25e9:
        return "slow_link"
    return "healthy"


def by_events(run, alone):
    """Right, in another style: from the events, not from summary()."""
    ranks = run.ranks
    busy = {r: sum(e.duration for e in run.for_rank(r) if e.kind == "compute")
            for r in ranks}
    one = sum(e.duration for e in alone if e.kind == "compute")
    one_span = max(e.end for e in alone) - min(e.start for e in alone)
    if max(busy.values()) > 1.3 * min(busy.values()):
        return "straggler"
    if min(busy.values()) > 0.75 * len(ranks) * one:
        return "same_gpu"
    if one < 0.8 * one_span:
        return "host_bound"
    forward = [min(e.start for e in run.for_rank(r) if e.name == "forward")
               for r in ranks]
    if min(forward) > 0.1 * one_span:
        return "starved_loader"
    comm = run.filter(kind="comm", rank=ranks[0]).events
    backward_end = max(e.end for e in run.for_rank(ranks[0]) if e.name == "backward")
    if all(e.start >= backward_end for e in comm):
        return "no_overlap"
    if len(comm) > 2 * 12:
        return "buckets_too_small"
    widest = max(comm, key=lambda e: e.nbytes)
    n = len(ranks)
    if widest.nbytes / widest.duration * 2 * (n - 1) / n < 0.7 * 31.5e9:
        return "slow_link"
    return "healthy"


def test_rules_written_another_way_pass(verdict):
    for right in (by_step_report, by_events):
        passed, seen = verdict("diagnose", right)
        assert passed, (right.__name__, seen)


def always_healthy(run, alone):
    return "healthy"


def idle_means_starved(run, alone):
    """Reads any idle as a starved loader: a straggler's victims idle too."""
    if min(r["idle_s"] for r in run.summary().values()) > 0 or \
            max(r["idle_s"] for r in run.summary().values()) > 0.05 * \
            next(iter(alone.summary().values()))["span_s"]:
        return "starved_loader"
    return diagnose(run, alone)


def ignores_the_one_gpu_run(run, alone):
    """Never looks at `alone`: a tiny model's lone bucket reads as no overlap."""
    verdict = diagnose(run, alone)
    return "no_overlap" if verdict == "host_bound" else verdict


def exposed_means_slow_link(run, alone):
    """Any exposed communication blamed on the link."""
    verdict = diagnose(run, alone)
    return "slow_link" if verdict in ("no_overlap", "buckets_too_small") else verdict


def returns_a_description(run, alone):
    return "the link is slow" if diagnose(run, alone) == "slow_link" else diagnose(run, alone)


def forgets_shared_gpus(run, alone):
    verdict = diagnose(run, alone)
    return "straggler" if verdict == "same_gpu" else verdict


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("diagnose", always_healthy, ("runs named wrong", "got 'healthy'", "Hint:")),
    ("diagnose", idle_means_starved, ("expected 'straggler'", "never idles")),
    ("diagnose", ignores_the_one_gpu_run, ("expected 'host_bound', got 'no_overlap'",
                                           "Look at `alone`")),
    ("diagnose", exposed_means_slow_link, ("expected 'no_overlap', got 'slow_link'",
                                           "overlap_s is about 0")),
    ("diagnose", returns_a_description, ("return one of", "'the link is slow'")),
    ("diagnose", forgets_shared_gpus, ("expected 'same_gpu', got 'straggler'",
                                       "N times the one-GPU run's")),
]
