"""Cluster presets: rank placement, collective times against the published
measurements they were calibrated on, NCCL's algorithm choice, clear errors."""
import pytest

from ddp_teach import cost
from ddp_teach.cost import Link
from ddp_teach.sim import CLUSTERS, Cluster, Simulation, cluster, nccl, predict

GIB, MIB, KIB = 2 ** 30, 2 ** 20, 2 ** 10


def busbw_gbps(cluster_name, op, nbytes, ranks, algorithm=None):
    sim = Simulation("H100 SXM", cluster=cluster_name, compute="peak")
    seconds = predict.collective(op, nbytes, ranks, sim, algorithm)
    return cost.busbw(op, nbytes, seconds, ranks) / 1e9


def test_presets_carry_their_datasheet_and_nccl_figures():
    assert set(CLUSTERS) >= {"DGX H100", "DGX A100", "4x RTX 4090", "2x T4 (Kaggle)"}
    h100 = cluster("dgx h100")
    assert (h100.gpus_per_node, h100.nics_per_node) == (8, 8)
    assert h100.nic_bandwidth == 50e9 and h100.network_bandwidth == 400e9
    assert h100.fabric_bandwidth == pytest.approx(18 * 20.6e9) and h100.nvls
    a100 = cluster("DGX A100")
    assert a100.nic_bandwidth == 25e9 and not a100.nvls
    assert cluster("2x T4 (Kaggle)").fabric == "PCIe"


def test_rank_r_sits_on_node_r_over_gpus_per_node():
    h100 = cluster("DGX H100")
    assert [h100.node_of(r) for r in (0, 7, 8, 15, 16)] == [0, 0, 1, 1, 2]
    assert h100.nodes_of(range(8)) == (1, 8)
    assert h100.nodes_of(range(32)) == (4, 8)
    assert h100.nodes_of([3, 11]) == (2, 1)


# The calibrating measurements (benchmarks/sim_vs_published.md): 16 GiB ring
# and 8 GiB NVLS on 8 H100/H200, 4 GiB over 4 nodes of 8 H100.
@pytest.mark.parametrize("op, nbytes, ranks, algorithm, published", [
    ("all_reduce", 16 * GIB, 8, "ring", 367.2),
    ("all_reduce", 8 * GIB, 8, "nvls", 478.87),
    ("all_reduce", 4 * GIB, 32, None, 330.93),
])
def test_dgx_h100_reproduces_the_measurements_it_was_calibrated_on(
        op, nbytes, ranks, algorithm, published):
    assert busbw_gbps("DGX H100", op, nbytes, ranks, algorithm) == \
        pytest.approx(published, rel=0.005)


def test_two_nodes_reproduce_the_nvls_tree_run_it_was_calibrated_on():
    # 512 MiB over 2 nodes of 8 H20 (NVLink 4, 8 NDR NICs each): 3,219 us
    sim = Simulation("H100 SXM", cluster="DGX H100")
    assert predict.collective("all_reduce", 512 * MIB, 16, sim) == pytest.approx(
        3219e-6, rel=0.005)


@pytest.mark.parametrize("name, ranks, published", [
    ("DGX A100", 8, 231.58),     # 8 GiB, Azure ND A100 v4
    ("DGX A100", 32, 192.0),     # across DGX A100 nodes, NVIDIA/nccl #812
    ("4x RTX 4090", 4, 25.95),   # PCIe 4.0, P2P on
])
def test_other_presets_land_within_tolerance_of_published_busbw(name, ranks, published):
    nbytes = GIB if name == "4x RTX 4090" else 4 * GIB
    assert 0.87 <= busbw_gbps(name, "all_reduce", nbytes, ranks) / published <= 1.15


def test_small_messages_cost_nccl_latency_not_a_ring_of_alphas():
    sim = Simulation("H100 SXM", cluster="DGX H100")
    # NCCL's ring LL on 8 GPUs: 6.6 us base + 14 hops of 0.6 us, and the
    # kilobyte itself on the one channel such a small buffer runs on (0.2 us)
    assert predict.collective("all_reduce", 1 * KIB, 8, sim) == pytest.approx(
        15.2e-6, rel=0.01)
    # across 4 nodes a tree: log2 of the nodes, not 62 ring steps
    assert predict.collective("all_reduce", 1 * KIB, 32, sim) < 40e-6


def test_nccl_picks_low_latency_protocols_for_small_and_nvls_for_large_in_a_node():
    h100 = cluster("DGX H100")
    chosen = {n: nccl.choose("all_reduce", n, 8, 1, h100) for n in
              (KIB, 64 * KIB, MIB, 2 * MIB, 256 * MIB)}
    # measured on 8 H200 with NCCL_DEBUG: ring + LL up to 1 MiB, NVLS from 2 MiB
    assert all((chosen[n].algorithm, chosen[n].protocol) == ("ring", "LL")
               for n in (KIB, 64 * KIB, MIB))
    assert all((chosen[n].algorithm, chosen[n].protocol) == ("nvls", "Simple")
               for n in (2 * MIB, 256 * MIB))
    a100 = cluster("DGX A100")  # no NVLink SHARP: a ring, full bandwidth
    assert nccl.choose("all_reduce", GIB, 8, 1, a100).algorithm == "ring"
    assert nccl.choose("all_reduce", GIB, 8, 1, a100).protocol == "Simple"
    assert nccl.choose("all_gather", 16 * GIB, 8, 1, h100).algorithm == "ring"


def test_across_nodes_small_messages_take_a_tree_and_large_ones_a_ring():
    h100 = cluster("DGX H100")
    assert nccl.choose("all_reduce", 512, 32, 4, h100).algorithm == "tree"
    assert nccl.choose("all_reduce", 512, 32, 4, h100).protocol == "LL"
    assert nccl.choose("all_reduce", 4 * GIB, 32, 4, h100).algorithm == "ring"


def test_pcie_never_uses_ll128_or_nvls():
    for name in ("4x RTX 4090", "2x T4 (Kaggle)"):
        gpus = CLUSTERS[name].gpus_per_node
        for n in (KIB, MIB, GIB):
            plans = nccl.plans("all_reduce", n, gpus, 1, CLUSTERS[name])
            assert {p.protocol for p in plans} == {"LL", "Simple"}
            assert {p.algorithm for p in plans} == {"ring", "tree"}


def test_spanning_nodes_is_slower_than_staying_inside_one():
    sim = Simulation("H100 SXM", cluster="DGX H100")
    inside = predict.collective("all_reduce", GIB, 8, sim)
    assert predict.collective("all_reduce", GIB, 16, sim) > inside
    assert sim.p2p_seconds(GIB, 0, 8) > 5 * sim.p2p_seconds(GIB, 0, 1)
    assert sim.p2p_seconds(GIB, 3, 3) == 0.0


def test_forcing_an_algorithm_and_the_flat_link_still_as_before():
    sim = Simulation("H100 SXM", cluster="DGX H100")
    ring = predict.collective("all_reduce", 64 * MIB, 8, sim, "ring")
    tree = predict.collective("all_reduce", 64 * MIB, 8, sim, "tree")
    assert ring != tree and min(ring, tree) >= predict.collective(
        "all_reduce", 64 * MIB, 8, sim)
    flat = Simulation("A100 80GB", "NVLink 4")
    assert predict.collective("all_reduce", MIB, 8, flat) == \
        cost.collective_time("all_reduce", MIB, 8, flat.link)
    assert flat.link_name == "NVLink 4" and flat.compute == "peak"


def test_simulation_modes_and_labels():
    sim = Simulation("H100 SXM", cluster="DGX H100")
    assert sim.compute == "achieved" and sim.link is None
    assert sim.achieved is sim.device.achieved
    assert sim.label == "simulated H100 SXM (achieved) in DGX H100 nodes"
    assert Simulation("H100 SXM", cluster="DGX H100", compute="peak").achieved is None
    assert Simulation("A100 80GB", "PCIe 4 x16").label == \
        "simulated A100 80GB + PCIe 4 x16"
    assert Simulation().link_name == "NVLink 4"


def test_bad_inputs_get_clear_errors():
    with pytest.raises(ValueError, match="'DGX H100'"):
        cluster("DGX B300")
    with pytest.raises(ValueError, match="not both"):
        Simulation("H100 SXM", "NVLink 4", cluster="DGX H100")
    with pytest.raises(ValueError, match="compute must be"):
        Simulation("H100 SXM", cluster="DGX H100", compute="turbo")
    with pytest.raises(ValueError, match="one machine of 2 GPUs"):
        predict.collective("all_reduce", MIB, 4, Simulation("T4", cluster="2x T4 (Kaggle)"))
    with pytest.raises(ValueError, match="unknown NCCL algorithm"):
        predict.collective("all_reduce", MIB, 8, Simulation(
            "H100 SXM", cluster="DGX H100"), "butterfly")
    with pytest.raises(ValueError, match="no 'nvls'"):
        predict.collective("all_reduce", MIB, 8, Simulation(
            "A100 80GB", cluster="DGX A100"), "nvls")
    with pytest.raises(ValueError, match="unknown collective"):
        nccl.choose("all_to_all", MIB, 8, 1, cluster("DGX H100"))
    with pytest.raises(ValueError, match="nbytes"):
        nccl.choose("all_reduce", -1, 8, 1, cluster("DGX H100"))
    with pytest.raises(ValueError, match="world_size"):
        predict.collective("all_reduce", MIB, 0, Simulation(cluster="DGX A100"))
    with pytest.raises(ValueError, match="fabric"):
        Cluster("x", 8, "carrier pigeon", 1e9, 0, 0.0)
    with pytest.raises(ValueError, match="gpus_per_node"):
        Cluster("x", 0, "PCIe", 1e9, 0, 0.0)
    with pytest.raises(ValueError, match="NVLink SHARP"):
        Cluster("x", 8, "PCIe", 1e9, 0, 0.0, nvls=True)
    with pytest.raises(ValueError, match="Link"):
        Simulation("A100 80GB", Link(-1.0, 0.0))


def test_nvls_moves_smaller_buffers_in_smaller_chunks_as_nccl_does():
    from ddp_teach.sim.model.comm import nvls_chunk_bytes
    concurrent = 16 * 8      # NVLS channels x one head per GPU of a DGX H100
    mib = 2 ** 20
    assert [nvls_chunk_bytes(n, concurrent) for n in
            (8192 * mib, 1024 * mib, 1024 * mib - 1, 64 * mib, 64 * mib - 1,
             8 * mib, 8 * mib - 1, 1024)] == \
        [131072, 131072, 65536, 65536, 32768, 32768, 16384, 16384]


def test_smaller_chunks_give_medium_nvls_all_reduces_less_of_the_bandwidth():
    from ddp_teach.sim.model import comm
    dgx = cluster("DGX H100")
    mib = 2 ** 20
    rates = {n: n / comm.collective_seconds("all_reduce", n, 8, dgx, "nvls")
             for n in (16 * mib, 256 * mib, 8192 * mib)}
    assert rates[16 * mib] < 0.7 * rates[8192 * mib] < rates[256 * mib]


def test_below_one_round_nvls_fills_channels_one_by_one_so_its_time_stays_flat():
    # channel c takes bytes [c, c + 1) x 8 heads x 16 KiB: from 128 KiB to 2 MiB
    # the busiest channel always holds 128 KiB (Azure's run: 42-45 us throughout)
    from ddp_teach.sim.model import comm
    dgx = cluster("DGX H100")
    kib = 1024
    times = {n: comm.collective_seconds("all_reduce", n * kib, 8, dgx, "nvls")
             for n in (1, 64, 128, 256, 1024, 2048)}
    assert max(times[n] for n in (128, 256, 1024)) < 1.1 * times[128]
    assert times[64] < times[128] < times[2048] < 1.25 * times[128]
    # one channel moves the 128 KiB at a sixteenth of the bandwidth: well above
    # the latency (17 us in that run), where spread over all 16 it would not be
    assert times[128] - times[1] > 10e-6


def test_a_small_ring_or_tree_runs_on_fewer_channels_than_its_estimate():
    """NCCL's enqueue.cc launches a ring or tree on one channel per
    threads x threshold bytes (Simple 512 x 64 = 32 KiB; LL 512 x 8 x ranks
    for a ring; LL128 640 x 8), at most all of them; NVLS keeps its own.
    A collective's bandwidth scales with the channels it runs on."""
    from ddp_teach.sim.model import comm, nccl
    from ddp_teach.sim.model.cluster import cluster
    ring = {p: nccl.Plan("ring", p, 0.0, 1.0) for p in nccl.PROTOCOLS}
    assert nccl.channels_used(ring["Simple"], 64 * 1024, 8, 16) == 2
    assert nccl.channels_used(ring["Simple"], 16 * 2 ** 20, 8, 16) == 16
    assert nccl.channels_used(ring["LL"], 64 * 1024, 8, 16) == 2      # 32 KiB each on 8 ranks
    assert nccl.channels_used(ring["LL"], 64 * 1024, 2, 16) == 8      # 8 KiB each on 2
    assert nccl.channels_used(ring["LL128"], 10 * 5120, 8, 16) == 10
    assert nccl.channels_used(ring["Simple"], 100, 8, 16) == 1
    tree = nccl.Plan("tree", "LL", 0.0, 1.0)
    assert nccl.channels_used(tree, 64 * 1024, 8, 16) == 16           # no x ranks for a tree
    assert nccl.channels_used(nccl.Plan("nvls", "Simple", 0.0, 1.0), 1024, 8, 16) == 16
    dgx = cluster("DGX H100")
    plan = nccl.choose("all_reduce", 64 * 1024, 8, 1, dgx)
    assert plan.algorithm == "ring" and plan.protocol == "LL"
    moved = comm.collective_seconds("all_reduce", 64 * 1024, 8, dgx) - plan.latency_s
    full = 64 * 1024 / (plan.bandwidth * comm.calibrated.LINK_FRACTIONS["in node"])
    assert moved == pytest.approx(full * 16 / 2)


def test_without_peer_to_peer_a_node_talks_through_host_memory():
    """A node whose GPUs cannot reach each other's memory (p2p=False: GeForce
    cards, many VMs, NCCL_P2P_DISABLE=1) stages every byte through the host:
    NCCL picks the same plan, and the bytes move at the "host memory"
    fraction of its estimate instead of the "in node" one; a point-to-point
    send too. Only a PCIe node can be without it."""
    from dataclasses import replace
    from ddp_teach.sim.model import calibrated, comm
    kaggle = cluster("2x T4 (Kaggle)")
    assert not kaggle.p2p and not cluster("2x RTX 4090 (no P2P)").p2p
    assert cluster("4x RTX 4090").p2p and cluster("DGX H100").p2p
    direct = replace(kaggle, p2p=True)
    fractions = calibrated.LINK_FRACTIONS
    for nbytes in (GIB, 256 * MIB):
        plan = nccl.choose("all_reduce", nbytes, 2, 1, kaggle)
        staged = comm.collective_seconds("all_reduce", nbytes, 2, kaggle) - plan.latency_s
        peer = comm.collective_seconds("all_reduce", nbytes, 2, direct) - plan.latency_s
        assert staged / peer == pytest.approx(fractions["in node"] / fractions["host memory"])
    assert comm.p2p_seconds(GIB, 0, 1, kaggle) > 2.5 * comm.p2p_seconds(GIB, 0, 1, direct)
    with pytest.raises(ValueError, match="host memory over PCIe"):
        Cluster("bad", 8, "NVLink", 1e11, 0, 0.0, p2p=False)
