import pytest

from sim.io import atomic_write_text
from trainsim.commands.demo import SCENARIO


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


def test_demo_scenario_is_the_issue_default():
    assert SCENARIO == {"model": "llama3-70b", "cluster": "dgx-h100:16",
                        "global_batch_size": 512, "seq_len": 8192}
