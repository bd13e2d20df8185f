"""Running ``trainsim`` in tests: in-process (fast) or as the real program, the bad-input
assertion every CLI test shares, and a known-good plan to edit."""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

from trainsim.cli import main

__all__ = ["GOOD_PLAN", "GPT3", "RESULT_KEYS", "BREAKDOWN_KEYS", "H100", "NEW", "DELETE", "cli",
           "run_trainsim", "assert_bad_input", "write_plan"]

# Megatron-LM SC'21 PTD-P plan for GPT-3 175B on 1024 A100s (128 DGX nodes).
GOOD_PLAN: dict[str, Any] = {
    "schema_version": 1, "global_batch_size": 1536, "seq_len": 2048, "dp": 16, "tp": 8,
    "pp": 8, "vpp": 4, "schedule": "interleaved-1f1b", "recompute": "full", "dtype": "fp16",
    "attention": "standard",
}
GPT3 = ["--model", "gpt3-175b", "--cluster", "dgx-a100:128"]
RESULT_KEYS = {"iteration_time_s", "tokens_per_s", "model_tflops_per_gpu",
               "hardware_tflops_per_gpu", "mfu", "peak_memory_gib", "fits_in_memory",
               "bubble_fraction", "breakdown"}
BREAKDOWN_KEYS = {"compute", "tp", "pp", "dp", "cp", "ep", "optimizer"}
NEW = ["plan", "new", "--global-batch-size", "8", "--seq-len", "256"]
H100 = 'nodes = 2\ngpus_per_node = 8\ngpu = "h100-sxm5-80gb"\n'


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``trainsim ARGS`` in-process: (exit code, stdout, stderr).

    An uncaught exception becomes exit code 1 with its traceback on stderr, as it would
    for the real program, so the bad-input assertions below catch it.
    """
    try:
        rc = main(list(args))
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        rc = exc.code if isinstance(exc.code, int) else 1
    except Exception:
        out, err = capsys.readouterr()
        return 1, out, err + traceback.format_exc()
    out, err = capsys.readouterr()
    return rc, out, err


def run_trainsim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def assert_bad_input(rc: int, out: str, err: str, *expected: str) -> None:
    """Exit 2, nothing on stdout, one ``trainsim: error:`` line naming field and rule."""
    assert "Traceback" not in out + err, err
    assert rc == 2, (rc, err)
    assert out == ""
    assert err.startswith("trainsim: error: "), err
    assert err.endswith("\n") and err.count("\n") == 1, err
    for text in expected:
        assert text in err, (text, err)


DELETE = object()  # an override that removes the field


def write_plan(tmp_path: Path, name: str = "plan.json", **overrides: Any) -> Path:
    data = {**GOOD_PLAN, **overrides}
    for key, value in overrides.items():
        if value is DELETE:
            del data[key]
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path
