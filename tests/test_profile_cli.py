"""``trainsim profile ...`` end to end on CPU."""

import json

import pytest
import torch

from trainsim.cli import main


def run(capsys, *args):
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_profile_compute_model_then_show(capsys, tmp_path):
    code, out, _ = run(capsys, "profile", "compute", "--model", "tiny", "--tp", "1",
                       "--micro-batch", "1", "--seq-len", "64", "--db", str(tmp_path))
    assert code == 0 and "shapes measured" in out
    code, out, _ = run(capsys, "profile", "show", "--db", str(tmp_path))
    assert code == 0 and "gemm" in out and "model-tiny" in out
    code, out, _ = run(capsys, "simulate", "--model", "tiny", "--cluster", "cpu:1", "--plan",
                       _plan(tmp_path), "--profile", str(tmp_path), "--json")
    result = json.loads(out)
    assert code == 0 and result["iteration_time_s"] > 0
    code, out, _ = run(capsys, "simulate", "--model", "tiny", "--cluster", "cpu:1", "--plan",
                       _plan(tmp_path), "--profile", str(tmp_path), "--compute-stat", "p10",
                       "--json")
    low = json.loads(out)
    assert code == 0 and low["iteration_time_s"] < result["iteration_time_s"]
    code, out, _ = run(capsys, "simulate", "--model", "tiny", "--cluster", "cpu:1", "--plan",
                       _plan(tmp_path), "--profile", str(tmp_path), "--set",
                       "compute_stat=p10", "--json")
    assert code == 0 and json.loads(out)["iteration_time_s"] == low["iteration_time_s"]


def _plan(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"global_batch_size": 1, "seq_len": 64, "dtype": "fp32"}))
    return str(path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_requested_without_gpu(capsys, tmp_path):
    code, out, err = run(capsys, "profile", "compute", "--device", "cuda", "--db", str(tmp_path))
    assert code == 2 and out == "" and err.startswith("trainsim: error: --device: cuda")


@pytest.mark.parametrize("args,needle", [
    (["profile", "show", "--db", "/nonexistent"], "--db: no profile DB"),
    (["profile", "import-trace", "/nonexistent.json"], "trace: no such file"),
    (["profile", "comm", "--collectives", "all_reduce,gossip"], "unknown 'gossip'"),
    (["profile", "compute", "--tp", "0"], "expected positive integers"),
    (["profile", "compute", "--passes", "0"], "--passes: must be >= 1"),
    (["profile", "comm", "--min-bytes", "0"], "--min-bytes: must be >= 1"),
    (["profile", "comm", "--min-bytes", "2048", "--max-bytes", "1024"],
     "--max-bytes: must be >= --min-bytes 2048"),
    (["simulate", "--model", "tiny", "--cluster", "cpu:1", "--plan", "x.json", "--profile",
      "/nonexistent"], "plan"),
    (["simulate", "--model", "tiny", "--cluster", "cpu:1", "--plan", "x.json",
      "--compute-stat", "mean"], "--compute-stat: invalid choice: 'mean'"),
    (["simulate", "--model", "tiny", "--cluster", "dgx-h100:1", "--plan", "x.json",
      "--compute-stat", "p10"], "compute_stat: p10 is a statistic of profiled times"),
])
def test_bad_profile_input(capsys, args, needle):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == "" and needle in err and len(err.splitlines()) == 1


def test_import_trace_bad_json(capsys, tmp_path):
    (tmp_path / "t.json").write_text("{oops")
    code, _, err = run(capsys, "profile", "import-trace", str(tmp_path / "t.json"))
    assert code == 2 and "not valid JSON" in err
