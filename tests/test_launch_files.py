"""launch/: the Slurm batch file and the SkyPilot task launch the same torchrun line, which the
two-node test in test_train_gpu.py runs on this machine (c10d rendezvous, one torchrun per node)."""
import shlex
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SLURM = REPO / "launch" / "slurm.sbatch"
SKY = REPO / "launch" / "skypilot.yaml"


def torchrun_lines(text):
    return [line.strip() for line in text.splitlines() if line.strip().startswith("torchrun ")]


def bash_n(script: str):
    r = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_both_launch_the_same_torchrun_line():
    sky = yaml.safe_load(SKY.read_text(encoding="utf-8"))
    slurm_lines, sky_lines = torchrun_lines(SLURM.read_text(encoding="utf-8")), torchrun_lines(sky["run"])
    assert len(slurm_lines) == 1 and slurm_lines == sky_lines
    argv = shlex.split(slurm_lines[0])
    flags = dict(zip(argv[1::2], argv[2::2]))
    assert flags["--rdzv-backend"] == "c10d"
    assert {"--nnodes", "--nproc-per-node", "--rdzv-endpoint", "--rdzv-id"} <= set(flags)
    script = next(a for a in argv if a.endswith(".py"))
    assert (REPO / script).is_file()
    assert sky["num_nodes"] == 2 and "#SBATCH --nodes=2" in SLURM.read_text(encoding="utf-8")


def test_shell_parts_pass_bash_n():
    bash_n(SLURM.read_text(encoding="utf-8"))
    sky = yaml.safe_load(SKY.read_text(encoding="utf-8"))
    for part in ("setup", "run"):
        bash_n(sky[part])
    assert (REPO / "requirements.txt").is_file()  # what the SkyPilot setup installs
