"""Workload graphs: the spec (sim/spec/workload.py, torch-free), tracing any torch module on
the meta device (profiler/graph), the shipped presets, and `trainsim trace`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.cli import assert_bad_input, cli
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from profiler.graph.sources import build
from profiler.graph.trace import scalar_of, trace_module
from profiler.graph.zoo import ZOO, trace_preset
from sim.errors import SpecError
from sim.spec.workload import Layer, Workload, load_workload, workload_from_dict
from sim.spec.zoo import load_any, load_model, workload_names


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(2, 8)


def test_a_small_network_by_hand():
    """Linear(8,4) -> ReLU -> Linear(4,2): every figure per sample, counted by hand."""
    w = trace_module(*_mlp(), "mlp")
    fc1, relu, fc2 = w.layers
    assert [x.name for x in w.layers] == ["0", "1", "2"]
    assert (fc1.param_tensors, fc2.param_tensors, relu.param_tensors) == ((32, 4), (8, 2), ())
    assert (fc1.forward_flops, fc2.forward_flops) == (2 * 8 * 4, 2 * 4 * 2)
    # fc1: weight gradient only (the input needs none); fc2: weight and input gradients
    assert (fc1.backward_flops, fc2.backward_flops) == (2 * 8 * 4, 2 * 2 * 4 * 2)
    # fc1 keeps its input (8 floats) for its weight gradient, ReLU its output (4 floats);
    # fc2's input is ReLU's output, already kept
    assert (fc1.saved_bytes, relu.saved_bytes, fc2.saved_bytes) == (32, 16, 0)
    # a cut after fc1 sends its output (4 floats); after fc2 nothing later reads
    assert (fc1.boundary_bytes, relu.boundary_bytes, fc2.boundary_bytes) == (16, 16, 0)


def test_residual_branch_crosses_the_cut_and_backward_is_attributed_exactly():
    w = load_any("resnet50")
    layers = {x.name: x for x in w.layers}
    # inside the first bottleneck both the block input (the identity branch) and conv1's
    # output are live: 2 x 64 x 56 x 56 fp32 per sample
    assert layers["layer1.0.conv1"].boundary_bytes == 2 * 64 * 56 * 56 * 4
    # each convolution's backward is its forward for each gradient it computes: the stem
    # has no input gradient, the downsample branch has both (module hooks get this wrong)
    for name, grads in (("conv1", 1), ("layer1.0.conv2", 2), ("layer1.0.downsample.0", 2)):
        assert layers[name].backward_flops == grads * layers[name].forward_flops


@pytest.mark.parametrize("name", list(ZOO))
def test_presets_match_the_module_and_flop_counter(name):
    """Parameters exactly sum(p.numel()); FLOPs those of FlopCounterMode on the whole model
    (forward always; backward too except grouped convolutions, which it overcounts)."""
    ref, seq = ZOO[name]
    module, example, _ = build(ref, 2, seq)
    w = load_any(name)
    assert isinstance(w, Workload)
    assert w.param_count == sum(p.numel() for p in module.parameters() if p.requires_grad)
    assert sorted(w.param_tensors) == sorted(p.numel() for p in module.parameters()
                                             if p.requires_grad)  # each tensor once
    with FlopCounterMode(display=False) as fwd:
        module(**example) if isinstance(example, dict) else module(example)
    assert w.forward_flops_per_sample * 2 == fwd.get_total_flops()
    with FlopCounterMode(display=False) as both:
        out = module(**example) if isinstance(example, dict) else module(example)
        scalar_of(out).backward()
    backward = both.get_total_flops() - fwd.get_total_flops()
    grouped = any(isinstance(m, nn.Conv2d) and m.groups > 1 for m in module.modules())
    if grouped:
        assert w.backward_flops_per_sample * 2 < backward
    else:
        assert w.backward_flops_per_sample * 2 == backward


def test_depthwise_backward_is_twice_forward():
    w = load_any("mobilenet-v3-small")
    dw = next(x for x in w.layers if x.name == "features.1.block.0.0")  # 3x3 depthwise
    assert dw.kind == "Conv2d" and dw.backward_flops == 2 * dw.forward_flops


def test_shipped_presets_equal_a_fresh_trace():
    for name in workload_names():
        shipped = json.loads((Path(__file__).parents[1] / "sim" / "data" / "workloads"
                              / f"{name}.json").read_text())
        assert json.loads(json.dumps(trace_preset(name).to_dict())) == shipped, name


def test_json_round_trip_and_one_line_errors(tmp_path):
    w = load_any("lstm-lm")
    path = tmp_path / "w.json"
    path.write_text(json.dumps(w.to_dict()))
    assert load_workload(path) == w
    bad = [({"schema_version": 2}, "workload.schema_version"), ({"colour": 1}, "workload.colour"),
           ({"layers": []}, "workload.layers")]
    for change, field in bad:
        with pytest.raises(SpecError) as err:
            workload_from_dict({**w.to_dict(), **change})
        assert err.value.field == field
    layer = w.to_dict()["layers"][0]
    for key, value in (("forward_flops", -1.0), ("forward_flops", float("inf")),
                       ("param_tensors", [0]), ("param_tensors", [1.5])):
        with pytest.raises(SpecError, match=key):
            workload_from_dict({**w.to_dict(), "layers": [{**layer, key: value}]})
    with pytest.raises(SpecError, match="unique"):
        Workload("x", (Layer("a", "Linear"), Layer("a", "ReLU")))


def test_transformer_commands_name_a_workload_as_such():
    with pytest.raises(SpecError, match="workload graph"):
        load_model("resnet50")


def test_batch_must_be_dimension_zero():
    class Gram(nn.Module):  # FLOPs grow with the square of dimension 0
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x) @ x.t()

    with torch.device("meta"):
        module, x = Gram(), torch.randn(3, 4)
    with pytest.raises(SpecError, match="not linear in dimension 0"):
        trace_module(module, x, "gram")


USER = {
    "good.py": "import torch\nfrom torch import nn\n\ndef make():\n"
               "    return nn.Sequential(nn.Linear(8, 4), nn.ReLU()), torch.randn(2, 8)\n",
    "notpy.py": "this is not python(\n",
    "nomodule.py": "def make():\n    return 3\n",
    "fails.py": "import torch\nfrom torch import nn\n\ndef make():\n"
                "    return nn.Linear(8, 4), torch.randn(2, 5)\n",
}


@pytest.mark.parametrize("ref, needle", [
    ("notpy.py:make", "is not Python"),
    ("nomodule.py:make", "must return (torch.nn.Module, example_input), got int"),
    ("fails.py:make", "forward or backward on the example input raised RuntimeError"),
    ("good.py:missing", "has no function 'missing'"),
    ("absent.py:make", "no file"),
    ("torchvision:resnet51", "torchvision has no classification model 'resnet51'"),
    ("builtin:gru", "unknown builtin 'gru'"),
    ("resnet50", "must be torchvision:NAME"),
])
def test_bad_models_are_one_line_and_write_nothing(capsys, tmp_path, monkeypatch, ref, needle):
    monkeypatch.chdir(tmp_path)
    for file, text in USER.items():
        Path(file).write_text(text)
    code, out, err = cli(capsys, "trace", "--model", ref, "--out", "w.json")
    assert_bad_input(code, out, err, needle)
    assert not Path("w.json").exists()


def test_trace_a_users_module(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("good.py").write_text(USER["good.py"])
    code, out, err = cli(capsys, "trace", "--model", "good.py:make", "--out", "w.json")
    assert code == 0, err
    w = load_workload("w.json")
    assert (w.name, w.param_count, len(w.layers)) == ("make", 36, 2)
    assert "2 layers, 36 trainable parameters" in out
    assert load_any("w.json") == w


def test_models_lists_the_workload_graphs(capsys):
    code, out, _ = cli(capsys, "models")
    assert code == 0 and "workload graphs (trainsim trace):" in out
    line = next(x for x in out.splitlines() if x.startswith("resnet50 "))
    assert "25.557 M params  143 layers; 8.18 GFLOP forward per sample" in line


def test_fold_gives_container_time_to_a_traced_layer():
    from profiler.graph.profile import fold

    names = ["conv1", "layer1.0", "layer1.0.conv1", "fc"]
    out = fold({"conv1": 1.0, "layer1": 0.5, "layer1.0.conv1": 2.0, "layer1.0.relu": 0.25,
                "": 0.125}, names)
    assert out == {"conv1": 1.125, "layer1.0": 0.75, "layer1.0.conv1": 2.0, "fc": 0.0}


def test_profile_a_workload_and_simulate_from_it(capsys, tmp_path):
    """Every layer measured, the step and AdamW beside them; simulate then takes the
    measured times: a one-device step is their sum plus the optimizer step."""
    from sim import Plan, load_cluster, simulate

    code, out, err = cli(capsys, "profile", "compute", "--model", "builtin:lstm-lm",
                         "--batch", "2", "--passes", "1", "--db", str(tmp_path))
    assert code == 0, err
    (path,) = tmp_path.glob("*/workloads/lstm-lm.json")
    w = load_workload(path)
    assert all(x.measured and x.measured[0].batch == 2 for x in w.layers)
    layers = sum(x.measured[0].forward_s + x.measured[0].backward_s for x in w.layers)
    r = simulate(w, load_cluster("cpu:1"), Plan(2, 1, 2, dp=1, dtype="fp32"))
    assert r.iteration_time_s == pytest.approx(layers + w.optimizer_s[0][1])
    assert "lstm-lm batch 2: step" in out
    assert (path.parent.parent / "graph_steps.csv").is_file()


def test_shipped_encoder_presets_rebuild_from_their_source():
    from executor.graph_run import build_from_workload

    module, example = build_from_workload(load_any("bert-base"), 1, "meta")
    assert sum(p.numel() for p in module.parameters()) == load_any("bert-base").param_count
    assert example["input_ids"].shape == (1, 128)


def test_a_users_function_takes_the_batch_or_refuses_another(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("b.py").write_text("import torch\nfrom torch import nn\n\ndef make(batch):\n"
                            "    return nn.Linear(8, 4), torch.randn(batch, 8)\n")
    Path("fixed.py").write_text(USER["good.py"])
    assert build("b.py:make", 16)[1].shape == (16, 8)
    assert build("fixed.py:make", None)[1].shape == (2, 8)
    with pytest.raises(SpecError, match="takes no batch argument"):
        build("fixed.py:make", 16)


@pytest.mark.parametrize("bad, field", [({"batch": "2"}, "batch"), ({"batch": True}, "batch"),
                                        ({"forward_s": "1"}, "forward_s"),
                                        ({"forward_s": float("inf")}, "forward_s"),
                                        ({"device": 3}, "device"), ({"dtype": "fp99"}, "dtype")])
def test_bad_measured_entries_are_one_line(bad, field):
    w = load_any("lstm-lm").to_dict()
    m = {"device": "cpu", "batch": 2, "forward_s": 1.0, "backward_s": 1.0} | bad
    w["layers"][0]["measured"] = [m]
    with pytest.raises(SpecError, match=field):
        workload_from_dict(w)
