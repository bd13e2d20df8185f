"""``trainsim profile tp``: whole TP layers and heads timed over two torchrun ranks (gloo)."""

import pandas as pd
import pytest

from executor.layer_profile import run_tp_profile, tp_shapes
from sim.cost.compute import layer_variant
from sim.errors import SpecError
from sim.spec.zoo import load_model
from trainsim.cli import main

TINY = load_model("tiny")


def test_shapes_carry_the_db_keys_the_cost_model_reads():
    shapes = tp_shapes(TINY, 2, [1, 4], [64], [False, True], "fp32")
    assert [(s["micro_batch"], s["sp"]) for s in shapes] == [(1, False), (1, True), (4, False),
                                                             (4, True)]
    keys = shapes[3]["keys"]
    assert set(keys) == {"tp-layer-sp", "tp-head-sp"}
    assert keys["tp-layer-sp"] == {"variant": layer_variant(TINY, 64), "m": 256, "n": 256,
                                   "k": 2, "dtype": "fp32", "grid": "model-tiny"}
    assert keys["tp-head-sp"]["variant"] == "tp=2;norm=rmsnorm"
    assert keys["tp-head-sp"]["k"] == TINY.vocab_size


@pytest.mark.parametrize("model, tp, seqs, sp, field", [
    ("tiny", 1, [64], [False], "--tp"),
    ("tiny", 3, [64], [False], "--tp"),  # 8 heads
    ("tiny", 2, [1024], [False], "--seq-len"),  # > max_seq_len 512
    ("tiny", 2, [63], [True], "--seq-len"),  # sequence parallel: tp must divide it
    ("mixtral-8x7b", 2, [64], [False], "--model"),
    ("deepseek-v3", 2, [64], [False], "--model"),
])
def test_bad_shapes_are_refused_before_launch(model, tp, seqs, sp, field):
    with pytest.raises(SpecError, match=f"^{field}"):
        tp_shapes(load_model(model), tp, [1], seqs, sp, "fp32")


def test_two_ranks_write_four_rows(tmp_path):
    folder, rows = run_tp_profile(TINY, 2, [1], [64], [False, True], tmp_path, samples=3,
                                  warmup=1)
    df = pd.read_csv(folder / "compute.csv")
    assert sorted(df["op"]) == ["tp-head", "tp-head-sp", "tp-layer", "tp-layer-sp"]
    assert (df["fwd_median_s"] > 0).all() and (df["bwd_median_s"] > 0).all()
    assert (df["fwd_p10_s"] <= df["fwd_median_s"]).all()
    assert (df["fwd_median_s"] <= df["fwd_p90_s"]).all()
    assert set(df["m"]) == {64} and set(df["grid"]) == {"model-tiny"}
    head = df[df["op"] == "tp-head"].iloc[0]
    layer = df[df["op"] == "tp-layer"].iloc[0]
    assert head["k"] == TINY.vocab_size and layer["k"] == 2
    # a second run merges into the table instead of replacing it
    run_tp_profile(TINY, 2, [2], [64], [False], tmp_path, samples=3, warmup=1)
    assert len(pd.read_csv(folder / "compute.csv")) == 6


def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    db = tmp_path / "db"
    assert main(["profile", "tp", "--model", "tiny", "--tp", "3", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["trainsim: error: --tp: 3 does not divide model.num_heads 8"]
    assert not db.exists()
