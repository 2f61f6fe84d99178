"""code/gpus.py: the GPU catalog and the lookup from a CUDA device name and SM count."""
import pytest

import gpus

look = gpus.gpu_for_device


@pytest.mark.parametrize("name, sms, want", [
    ("NVIDIA H100 80GB HBM3", 132, "H100"),
    ("NVIDIA H100 80GB HBM3", None, "H100"),
    ("NVIDIA H100 PCIe", 114, "H100-PCIe"),
    ("NVIDIA H100 PCIe", None, "H100-PCIe"),
    ("NVIDIA H100", 114, "H100-PCIe"),  # the name says nothing; the SM count does
    ("NVIDIA H100 NVL", 132, "H100-NVL"),
    ("NVIDIA H800", 132, "H800"),
    ("NVIDIA H800 PCIe", 114, "H800-PCIe"),
    ("NVIDIA H200", 132, "H200"),
    ("NVIDIA H200 NVL", 132, "H200-NVL"),
    ("NVIDIA H20", 78, "H20"),
    ("NVIDIA A100-SXM4-80GB", 108, "A100"),
    ("NVIDIA A100-PCIE-40GB", 108, "A100-40GB"),
    ("NVIDIA A800-SXM4-80GB", 108, "A800"),
    ("NVIDIA L4", 58, "L4"),
    ("NVIDIA L40S", 142, "L40S"),
    ("NVIDIA A10", 72, "A10"),
    ("Tesla T4", 40, "T4"),
    ("Tesla V100-SXM2-16GB", 80, "V100"),
    ("Tesla V100-PCIE-32GB", 80, "V100-PCIe"),
    ("NVIDIA GeForce RTX 3060", 28, "RTX3060"),
    ("NVIDIA GeForce RTX 4070", 46, "RTX4070"),
    ("NVIDIA GeForce RTX 4090", 128, "RTX4090"),
])
def test_device_names_and_sm_counts_map_to_entries(name, sms, want):
    assert look(name, sms).name == want


@pytest.mark.parametrize("name, sms", [
    ("NVIDIA H100 80GB HBM3", 66),  # a MIG slice or a cut-down part: not the whole GPU's peak
    ("NVIDIA A10G", 80), ("NVIDIA RTX A1000", 16), ("NVIDIA GeForce RTX 4090 Laptop GPU", 76),
    ("NVIDIA GeForce RTX 3060 Ti", 38), ("NVIDIA GeForce RTX 4070 SUPER", 56), ("NVIDIA GeForce RTX 4070", 60),
    ("NVIDIA B100", None), ("AMD Instinct MI300X", 304),
])
def test_unknown_devices_get_no_peak(name, sms):
    assert look(name, sms) is None
    peak, note = gpus.describe_peak(name, sms)
    assert peak is None and "not in the peak table" in note and "no MFU" in note and "\n" not in note


def test_peaks_and_precisions():
    assert look("NVIDIA H100 80GB HBM3").peak_flops == 989e12 and look("NVIDIA H100 PCIe").peak_flops == 756e12
    assert look("NVIDIA A100-SXM4-80GB").peak_flops == look("NVIDIA A100-PCIE-40GB").peak_flops == 312e12
    assert look("NVIDIA GeForce RTX 4090").peak_flops == 165.2e12
    assert look("Tesla T4").peak_flops == 65e12 and look("Tesla V100-SXM2-16GB").peak_flops == 125e12
    assert [g.name for g in gpus.CATALOG if not g.bf16] == ["T4", "V100-PCIe", "V100"]
    assert all(g.precision in ("bf16", "fp16") for g in gpus.CATALOG)
    peak, note = gpus.describe_peak("Tesla T4", 40)
    assert peak == 65e12 and note == "Tesla T4 (40 SMs) → T4, fp16 dense peak 65 TFLOP/s"


def test_names_are_unique_and_keys_lower_case():
    assert len(gpus.GPUS) == len(gpus.CATALOG)
    assert all(gpus.GPUS[g.name.lower()] is g for g in gpus.CATALOG)
