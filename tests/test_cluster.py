import pytest

from sim.errors import SpecError
from sim.spec.cluster import load_cluster

ISSUE_TOML = """
nodes = 16
gpus_per_node = 8
gpu = "h100-sxm5-80gb"            # catalog name
[intra_node]
kind = "nvswitch"                  # nvswitch | pcie | nvlink-mesh
bandwidth_GBps = 450               # per GPU, per direction
[inter_node]
topology = "fat-tree"              # fat-tree | rail-optimized | torus2d | torus3d | dragonfly
nic_Gbps = 400                     # per NIC, per direction
nics_per_node = 8
oversubscription = 1.0             # above the pod; 7.0 means 1:7
pod_gpus = 3072                    # GPUs under full bisection
latency_us = 2.0
"""


def test_presets():
    a = load_cluster("dgx-a100:4")
    assert (a.world_size, a.gpu.name, a.intra_node.kind) == (32, "a100-sxm4-80gb", "nvswitch")
    assert a.nic_GBps_per_gpu == 25.0  # 8 x 200 Gb/s over 8 GPUs
    h = load_cluster("dgx-h100:2")
    assert h.nic_GBps_per_gpu == 50.0 and h.intra_node.bandwidth_GBps == 450
    assert load_cluster("hgx-h200:1").gpu.memory_gib > 140
    cpu = load_cluster("cpu:2")
    assert (cpu.nodes, cpu.world_size, cpu.gpu.name) == (1, 2, "cpu")


def test_issue_toml(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(ISSUE_TOML)
    c = load_cluster(str(path))
    assert c.world_size == 128 and c.pod_size == 128 and c.name == "c"
    assert c.inter_node.pod_gpus == 3072 and c.inter_node.latency_us == 2.0


@pytest.mark.parametrize("ref,match", [
    ("dgx-h100", "needs a positive count"), ("dgx-h100:0", "needs a positive count"),
    ("dgx-h100:x", "needs a positive count"), ("foo:2", "unknown preset"),
])
def test_bad_presets(ref, match):
    with pytest.raises(SpecError, match=match):
        load_cluster(ref)


@pytest.mark.parametrize("edit,match", [
    (("nodes = 16", "nodes = 0"), "nodes: must be a positive integer"),
    (("nodes = 16", "nodes = \"16\""), "nodes: must be a positive integer"),
    (('"fat-tree"  ', '"ring"  '), "inter_node.topology: must be one of"),
    (("oversubscription = 1.0", "oversubscription = 0.5"), "oversubscription"),
    (("pod_gpus = 3072", "pod_gpus = 12"), "pod_gpus"),
    (('gpu = "h100-sxm5-80gb"', 'gpu = "v100"'), "unknown device 'v100'"),
    (("latency_us = 2.0", "latency = 2.0"), "inter_node.latency: unknown field"),
    (('kind = "nvswitch"', 'kind = "wifi"'), "intra_node.kind"),
    (("nodes = 16", "nodes = "), "not valid TOML"),
])
def test_bad_toml(tmp_path, edit, match):
    path = tmp_path / "c.toml"
    path.write_text(ISSUE_TOML.replace(*edit))
    with pytest.raises(SpecError, match=match):
        load_cluster(str(path))


def test_missing_file():
    with pytest.raises(SpecError, match="no such file"):
        load_cluster("nope.toml")
