"""``trainsim profile fsdp``: FSDP2 units timed over two torchrun ranks (gloo) against the
same modules unwrapped."""

import pandas as pd
import pytest

from executor.fsdp_profile import UNITS, fsdp_shapes, run_fsdp_profile
from sim.errors import SpecError
from trainsim.cli import main


def test_shapes_carry_the_db_keys_the_cost_model_reads():
    shapes = fsdp_shapes([1 << 20, 1 << 16, 1 << 20], 2, "fp32")
    assert [(s["params"], s["units"]) for s in shapes] == [
        (1 << 16, UNITS[0]), (1 << 16, UNITS[1]), (1 << 20, UNITS[0]), (1 << 20, UNITS[1])]
    assert shapes[0]["key"] == {"variant": "reshard=True;tensors=8", "dtype": "fp32",
                                "grid": "fsdp", "m": 1 << 16, "n": UNITS[0], "k": 2}


@pytest.mark.parametrize("params, dp, field", [
    ([1 << 16], 1, "--dp"), ([100], 2, "--params"), ([1 << 30], 2, "--params"),
    ([4096 + 2048], 2, "--params")])  # not whole matrices split evenly
def test_bad_shapes_are_refused_before_launch(params, dp, field):
    with pytest.raises(SpecError, match=f"^{field}"):
        fsdp_shapes(params, dp, "fp32")


def test_two_ranks_write_both_ops_per_shape(tmp_path):
    folder, rows = run_fsdp_profile(2, [1 << 14], tmp_path, samples=3, warmup=1)
    df = pd.read_csv(folder / "compute.csv")
    assert sorted(df["op"]) == ["fsdp-plain"] * 2 + ["fsdp-units"] * 2
    assert (df["fwd_median_s"] > 0).all() and (df["bwd_median_s"] > 0).all()
    assert (df["fwd_p10_s"] <= df["fwd_median_s"]).all()
    assert set(df["n"]) == set(UNITS) and set(df["k"]) == {2}
    # FSDP2 gathers and reduce-scatters every unit: slower than the modules alone
    units = df[df["op"] == "fsdp-units"].set_index("n")
    plain = df[df["op"] == "fsdp-plain"].set_index("n")
    assert (units["bwd_median_s"] > plain["bwd_median_s"]).all()


def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    db = tmp_path / "db"
    assert main(["profile", "fsdp", "--params", "100", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["trainsim: error: --params: 100 must be a multiple of 4096 (8 matrices of "
                   "256 columns, rows split over 2 ranks) up to 268435456"]
    assert not db.exists()
