"""Compressed gradient averaging in the real BSP runs (executor/sync/compress.py): the
codecs, the bytes each scheme sends (the simulator's wire bytes), and real runs."""

from __future__ import annotations

import pytest
import torch

from executor.sync.compress import BLOCK, _decode, _encode
from executor.sync.launch import execute_sync_batch
from sim.spec.plan import Plan


def test_int8_codec_is_within_half_a_step_of_its_scale() -> None:
    x = torch.randn(1000) * torch.linspace(0.01, 5, 1000)
    parts = _encode("int8", x)
    assert parts[0].dtype == torch.int8 and parts[1].numel() == -(-1000 // BLOCK)
    back = _decode("int8", parts, 1000)
    scale = parts[1].repeat_interleave(BLOCK)[:1000]
    assert torch.all((back - x).abs() <= scale / 2 + 1e-6)


def test_onebit_codec_keeps_signs_and_block_mean_magnitudes() -> None:
    x = torch.randn(512)
    packed, scale = _encode("onebit", x)
    assert packed.numel() == 512 // 8 and packed.dtype == torch.uint8
    back = _decode("onebit", [packed, scale], 512)
    assert torch.equal(back >= 0, x >= 0)
    assert back.abs().view(2, BLOCK).mean(dim=1) == pytest.approx(
        x.abs().view(2, BLOCK).mean(dim=1), rel=1e-6)


def test_real_compressed_runs_send_the_simulators_bytes_and_learn() -> None:
    from sim.layout.sync import wire_bytes_per_element

    comps = ["none", "fp16", {"kind": "powersgd", "rank": 2}, "int8", "onebit",
             {"kind": "topk", "ratio": 0.1}]
    n = 4
    runs = [(Plan(global_batch_size=32 * n, seq_len=1, dp=n, compression=c), 0.4, 0)
            for c in comps]
    out = {p.compression.kind: (p, r) for (p, _, _), r in
           zip(runs, execute_sync_batch(runs, "digits", steps=40, eval_every=40), strict=True)}
    numel = 64 * 64 + 64 + 64 * 10 + 10  # the digits MLP: 4,810 parameters
    ring = 2 * (n - 1) / n  # a ring all-reduce sends this much of its payload
    for kind in ("none", "fp16", "int8", "onebit"):  # reduced in compressed form
        p, r = out[kind]
        sim = wire_bytes_per_element(p.compression, 4) * numel * ring
        assert r["sent_bytes_per_step"] == pytest.approx(sim, rel=0.08), kind  # + padding
    p, r = out["topk"]  # all-gathered: every other worker gets this worker's values
    assert r["sent_bytes_per_step"] == round(0.1 * numel) * 8 * (n - 1)
    assert r["sent_bytes_per_step"] == pytest.approx(
        wire_bytes_per_element(p.compression, 4) * numel * (n - 1), rel=0.01)
    # PowerSGD rank 2: P and Q of both weight matrices, biases whole
    assert out["powersgd"][1]["sent_bytes_per_step"] == 4 * (2 * 128 + 2 * 74 + 74) * ring
    for kind, (_, r) in out.items():
        first, last = r["evals"][0], r["evals"][-1]
        assert last["accuracy"] > first["accuracy"] + 0.3, kind
