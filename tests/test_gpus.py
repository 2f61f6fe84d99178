"""code/gpus.py: the GPU catalog and the lookup from a CUDA device name."""
import gpus


def test_device_names_map_to_peaks():
    look = gpus.gpu_for_device
    assert look("NVIDIA H100 80GB HBM3").peak_flops == 989e12
    assert look("NVIDIA H100 PCIe").peak_flops == 756e12
    assert look("NVIDIA H200").peak_flops == 989e12
    assert look("NVIDIA A100-SXM4-80GB").peak_flops == 312e12
    assert look("NVIDIA GeForce RTX 4090").peak_flops == 165.2e12
    assert look("NVIDIA L40S").peak_flops == 362e12 and look("NVIDIA L4").peak_flops == 121e12
    assert look("NVIDIA A10").name == "A10"
    for unknown in ("NVIDIA A10G", "NVIDIA RTX A1000", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090 Laptop GPU"):
        assert look(unknown) is None, unknown


def test_names_are_unique_and_keys_lower_case():
    assert len(gpus.GPUS) == len(gpus.CATALOG)
    assert all(gpus.GPUS[g.name.lower()] is g for g in gpus.CATALOG)
