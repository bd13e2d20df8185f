import json

import pytest

from sim.errors import SpecError
from sim.spec.cluster import load_cluster
from sim.spec.plan import Plan, load_plan, save_plan, validate
from sim.spec.zoo import load_zoo

GPT3 = load_zoo("gpt3-175b")


def test_defaults_and_derived():
    p = Plan(global_batch_size=64, seq_len=2048, dp=4, micro_batch_size=2)
    assert (p.tp, p.pp, p.cp, p.ep, p.vpp, p.schedule, p.zero_stage) == (1, 1, 1, 1, 1, "1f1b", 0)
    assert (p.recompute, p.dtype, p.placement, p.attention) == ("none", "bf16",
                                                                "tp-cp-ep-dp-pp", "flash")
    assert p.world_size == 4 and p.num_microbatches == 8


def test_json_round_trip(tmp_path):
    p = Plan(global_batch_size=64, seq_len=2048, dp=2, tp=2, pp=2, vpp=2,
             schedule="interleaved-1f1b", collectives=(("dp", "ring"),),
             layers_per_stage=(24, 24, 24, 24), placement=tuple(range(8)))
    save_plan(p, tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["schema_version"] == 1 and data["collectives"] == {"dp": "ring"}
    assert load_plan(tmp_path / "p.json") == p


def test_world_size_error_shows_arithmetic():
    p = Plan(global_batch_size=1536, seq_len=2048, dp=8, tp=8, pp=16)
    with pytest.raises(SpecError, match=r"8\*8\*16\*1 = 1024 != 1536 GPUs"):
        validate(p, GPT3, load_cluster("dgx-a100:192"))


@pytest.mark.parametrize("kw,match", [
    (dict(dp=3), r"multiple of dp\*micro_batch_size = 3\*1 = 3"),
    (dict(tp=0), "plan.tp: must be an integer >= 1"),
    (dict(tp=True), "plan.tp"),
    (dict(zero_stage=4), "zero_stage"),
    (dict(schedule="zb-v"), "plan.schedule: must be one of"),
    (dict(recompute="some"), "plan.recompute"),
    (dict(dtype="int8"), "plan.dtype"),
    (dict(vpp=2), "vpp: must be 1 unless schedule is interleaved-1f1b"),
    (dict(schedule="interleaved-1f1b", pp=2), "needs pp > 1 and vpp >= 2"),
    (dict(schedule="interleaved-1f1b", pp=3, vpp=2), r"64 % 3 != 0"),
    (dict(sequence_parallel=True), "needs tp > 1"),
    (dict(dp=4, ep=3), r"etp x ep = 1 x 3 must divide tp x cp x dp = 1 x 1 x 4 = 4"),
    (dict(cp=3), "multiple of 2\\*cp = 6"),
    (dict(placement="tp-dp-pp"), "placement: must order each of"),
    (dict(placement=(0, 0)), "permutation"),
    (dict(collectives=(("dp", "magic"),)), "'magic' is not an algorithm for this group"),
    (dict(collectives=(("pp", "ring"),)), "choose from: auto"),
    (dict(collectives=(("ep", "tree"),)), "choose from: auto, direct, pairwise"),
    (dict(collectives=(("xx", "ring"),)), "unknown group 'xx'"),
])
def test_plan_rules(kw, match):
    with pytest.raises(SpecError, match=match):
        Plan(**{"global_batch_size": 64, "seq_len": 2048, **kw})


@pytest.mark.parametrize("kw,match", [
    (dict(tp=5), r"num_heads: 96 % 5 = 1"),
    (dict(pp=5), r"pp\*vpp = 5\*1 = 5 must divide model.num_layers = 96"),
    (dict(pp=2, layers_per_stage=(40, 40)), r"40\+40 = 80 != model.num_layers = 96"),
    (dict(pp=2, layers_per_stage=(96,)), "must list pp\\*vpp = 2"),
    (dict(dp=2, ep=2), "must be 1 for the dense model"),
    (dict(seq_len=4096), "exceeds the model's learned position table of 2048"),
])
def test_plan_rules_against_model(kw, match):
    p = Plan(**{"global_batch_size": 64, "seq_len": 2048, **kw})
    with pytest.raises(SpecError, match=match):
        validate(p, GPT3)


def test_uneven_layers_accepted():
    validate(Plan(global_batch_size=64, seq_len=2048, pp=2, layers_per_stage=(47, 49)), GPT3)


def test_fp8_rejected_on_a100():
    p = Plan(global_batch_size=64, seq_len=2048, dp=8, dtype="fp8")
    with pytest.raises(SpecError, match="fp8 is not supported by a100"):
        validate(p, GPT3, load_cluster("dgx-a100:1"))


def test_from_dict_rejects_unknown_and_missing_and_versions():
    with pytest.raises(SpecError, match="plan.dq: unknown field"):
        Plan.from_dict({"global_batch_size": 8, "seq_len": 8, "dq": 2})
    with pytest.raises(SpecError, match="plan.seq_len: is required"):
        Plan.from_dict({"global_batch_size": 8})
    with pytest.raises(SpecError, match="schema_version"):
        Plan.from_dict({"schema_version": 99, "global_batch_size": 8, "seq_len": 8})


def test_load_plan_errors(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_plan(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_plan(tmp_path / "bad.json")


def test_expert_with_tensor_parallel_needs_sequence_parallel():
    m = load_zoo("mixtral-8x7b")
    for ep in (8, 1):  # Megatron-LM routes each TP rank's sequence shard, EP or not
        with pytest.raises(SpecError, match="sequence_parallel: must be true for an MoE"):
            validate(Plan(global_batch_size=64, seq_len=4096, dp=8, ep=ep, tp=2), m)
    validate(Plan(global_batch_size=64, seq_len=4096, dp=8, ep=8, tp=2,
                  sequence_parallel=True), m)


def test_nvls_needs_hopper_nvswitch():
    p = Plan(global_batch_size=64, seq_len=2048, dp=8, collectives=(("dp", "nvls"),))
    validate(p, GPT3, load_cluster("dgx-h100:1"))
    with pytest.raises(SpecError, match="nvls needs NVSwitch in-switch reduction"):
        validate(p, GPT3, load_cluster("dgx-a100:1"))
