import csv
import math
from dataclasses import fields
from importlib import resources

import pytest

from sim.errors import SpecError
from sim.spec.hardware import HardwareSpec, catalog, get_hardware

REQUIRED = ("a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb", "b200", "mi300x", "cpu")


def test_catalog_has_every_device_and_field():
    cat = catalog()
    assert set(REQUIRED) <= set(cat)
    assert all(hw.stack == "" for hw in cat.values())  # a stack is a cluster's choice
    for hw in cat.values():
        for f in fields(HardwareSpec):
            if f.name not in ("name", "stack", "fp8_tflops", "bf16_tflops"):
                assert not math.isnan(getattr(hw, f.name)), (hw.name, f.name)


def test_pre_ampere_devices_refuse_bf16_and_train_fp32_at_the_fp32_rate():
    for name in ("v100-sxm2-16gb", "p100-pcie-16gb"):
        hw = get_hardware(name)
        with pytest.raises(SpecError, match="bf16 is not supported"):
            hw.peak_tflops("bf16")
        assert hw.peak_tflops("fp32") == hw.fp32_tflops  # no TF32 before Ampere
    assert math.isnan(get_hardware("v100-sxm2-16gb").bf16_tflops)
    assert get_hardware("a100-sxm4-80gb").bf16_tflops == 312


def test_every_number_has_a_source():
    text = resources.files("sim").joinpath("data/hardware.csv").read_text()
    for row in csv.DictReader(text.splitlines()):
        assert len(row["source"]) > 10, row


def test_values_match_shared_hardware_specs():
    # experiments/data/hardware_specs.csv: dense BF16, HBM GB/s, NVLink per direction
    a, h, h2 = (get_hardware(n) for n in REQUIRED[:3])
    assert (a.bf16_tflops, a.hbm_GBps, a.nvlink_GBps) == (312, 2039, 300)
    assert (h.bf16_tflops, h.hbm_GBps, h.nvlink_GBps) == (989.4, 3350, 450)
    assert (h2.bf16_tflops, h2.hbm_GBps, h2.nvlink_GBps) == (989.4, 4800, 450)


def test_peak_per_dtype():
    h = get_hardware("h100-sxm5-80gb")
    assert h.peak_tflops("fp8") == 1978.9 and h.peak_tflops("fp32") == 494.7  # TF32
    with pytest.raises(SpecError, match="fp8 is not supported"):
        get_hardware("a100-sxm4-80gb").peak_tflops("fp8")


def test_unknown_device():
    with pytest.raises(SpecError, match="unknown device 'v100'"):
        get_hardware("v100")
