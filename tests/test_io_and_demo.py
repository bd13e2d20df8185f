import json

import pytest

from sim.io import atomic_write_text
from trainsim.demo import run_demo


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "a" / "result.json"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in path.parent.iterdir()] == ["result.json"]


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "result.json"
    atomic_write_text(path, "old")

    class Boom(str):
        def __str__(self):
            raise RuntimeError("boom")

    with pytest.raises(TypeError):
        atomic_write_text(path, object())  # type: ignore[arg-type]
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_demo_writes_results_and_plot(tmp_path, capsys):
    assert run_demo(tmp_path) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert len(data) == 5 and all(d["result"]["iteration_time_s"] > 0 for d in data)
    assert (tmp_path / "breakdown.png").stat().st_size > 10_000
    assert "gpt3-175b" in capsys.readouterr().out
