"""launch/: the Slurm batch file and the SkyPilot task launch the same torchrun line, which the
two-node test in test_train_gpu.py runs on this machine (c10d rendezvous, one torchrun per node)."""
import os
import shlex
import subprocess
from pathlib import Path

import pytest
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


def test_both_install_requirements_train_on_the_box():
    sky = yaml.safe_load(SKY.read_text(encoding="utf-8"))
    for text in (sky["setup"], SLURM.read_text(encoding="utf-8")):
        installs = [line for line in text.splitlines() if "pip install" in line]
        assert len(installs) == 1 and "-r requirements-train.txt" in installs[0], installs


def test_shell_parts_pass_bash_n():
    bash_n(SLURM.read_text(encoding="utf-8"))
    sky = yaml.safe_load(SKY.read_text(encoding="utf-8"))
    for part in ("setup", "run"):
        bash_n(sky[part])
    assert (REPO / "requirements.txt").is_file()  # what the SkyPilot setup installs


def test_train_gpu_and_torchrun_accept_the_launch_line():
    import sys
    sys.path.insert(0, str(REPO / "code"))
    from torch.distributed.run import get_args_parser

    from train_gpu import build_parser
    notice = SLURM.read_text(encoding="utf-8").split("\nNOTICE_S=")[1].split()[0]
    argv = shlex.split(torchrun_lines(SLURM.read_text(encoding="utf-8"))[0].replace('"', "")
                       .replace("$NOTICE_S", notice))[1:]
    ns = get_args_parser().parse_args(argv)  # the launcher's own flags
    assert "SIGUSR1" in ns.signals_to_handle and "SIGTERM" in ns.signals_to_handle
    # the workers' time to save after the signal: longer than torchrun's 30 s default, within Slurm's notice
    lead = int(SLURM.read_text(encoding="utf-8").split("#SBATCH --signal=USR1@")[1].split()[0])
    assert 30 < ns.shutdown_timeout < lead, (ns.shutdown_timeout, lead)
    default = SLURM.read_text(encoding="utf-8").split("TRAIN_ARGS=${TRAIN_ARGS:-")[1].split("}")[0]
    assert default in SKY.read_text(encoding="utf-8")
    script_args = [x for a in ns.training_script_args for x in (default.split() if a == "$TRAIN_ARGS" else [a])]
    args = build_parser().parse_args(script_args)
    assert args.auto_resume and args.out == "$OUT" and args.shard == "hsdp"  # the budget's choice across nodes
    assert args.notice_s == ns.shutdown_timeout  # what the workers have after Slurm's --signal, for --preflight


@pytest.mark.parametrize("status, attempt, requeued, rc", [(75, 1, True, 0), (75, 0, False, 1), (3, 1, False, 1),
                                                       (None, 1, False, 1)])
def test_slurm_requeues_on_the_preemption_status(tmp_path, status, attempt, requeued, rc):
    """The batch file run with stub srun/scontrol: torchrun exits 1 whatever happened; the status rank 0
    recorded in run.json for this attempt (restart 1 here) decides whether the job is requeued, and a 75
    that restart 0 left (this attempt's workers failed before training) does not. tests/test_slurm.py
    runs the file on a real Slurm cluster."""
    import json
    import os
    import sys
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\ncase "$*" in *"pip install"*) exit 0;; esac\nexit 1\n')
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.log\necho node1\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    if status is not None:
        (out / "run.json").write_text(json.dumps({"exit_code": status, "attempt": f"slurm job 42 restart {attempt}"}))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out), "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1",
           "SLURM_GPUS_ON_NODE": "8", "VENV": str(tmp_path / "venv")}
    r = subprocess.run(["bash", str(SLURM)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == rc, r.stdout + r.stderr
    log = (tmp_path / "scontrol.log").read_text()
    assert ("requeue 42" in log) == requeued, log
    assert requeued or r.stdout.rstrip().endswith("not requeued"), r.stdout


@pytest.mark.parametrize("recorded, expected", [
    ([4], 4), ([None], 4), ([3], 3), ([74], 74), ([1], 1), ([0], 0), ([75], 75),
    ([None, 4, 4, 4], 1),  # a fourth hang in a row: it is no longer the node
    ([None, 4, 75, 4], 4),  # a stop with a checkpoint between: the count starts again
    ("stale", 1),  # run.json from an earlier attempt: this one failed before training (its log says why)
])
def test_skypilot_retries_only_what_another_node_can_change(tmp_path, recorded, expected):
    """The SkyPilot task's `run` with a stub torchrun that exits 1 whatever its workers did (as torchrun does)
    and leaves run.json as rank 0 would: the task exits 4 (which job_recovery retries on new nodes, and only
    that) for a hang or a crash that recorded nothing, its own status otherwise, so that a NaN, a bad
    setting or a full disk is not retried from the last checkpoint three times (C9). The bucket is mounted
    as SkyPilot recommends for checkpoints (MOUNT_CACHED). What it cannot see: SkyPilot itself."""
    import json
    import os
    import sys
    sky = yaml.safe_load(SKY.read_text(encoding="utf-8"))
    recovery = sky["resources"]["job_recovery"]
    assert recovery["max_restarts_on_errors"] == 0 and recovery["recover_on_exit_codes"] == [4]
    assert sky["file_mounts"]["/ckpt"]["mode"] == "MOUNT_CACHED"
    out, bin_dir = tmp_path / "out", tmp_path / "bin"
    out.mkdir(), bin_dir.mkdir()
    start = "2000-01-01T00:00:00+00:00" if recorded == "stale" else "NOW"  # NOW: when torchrun runs
    codes = [0] if recorded == "stale" else recorded
    record = {"start": start, "exit_code": codes[-1], "earlier_runs": [{"exit_code": c} for c in codes[:-1]]}
    (tmp_path / "record.json").write_text(json.dumps(record))
    rc = 0 if codes[-1] == 0 and recorded != "stale" else 1
    (bin_dir / "torchrun").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\nsed "s/NOW/$(date -u +%Y-%m-%dT'
                                      f'%H:%M:%S+00:00)/" {tmp_path}/record.json > "$OUT/run.json"\nexit {rc}\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out), "SKYPILOT_NUM_NODES": "2",
           "SKYPILOT_NUM_GPUS_PER_NODE": "8", "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_TASK_ID": "t",
           "SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "GCP"})}
    r = subprocess.run(["bash", "-c", sky["run"]], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == expected, r.stdout + r.stderr
    assert "--notice-s 30 " in (tmp_path / "argv").read_text()  # GCP's spot notice


def older_python():
    """A real Python older than 3.11 on this machine (on PATH or pyenv's), or None."""
    import glob
    import shutil
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.[89]*/bin/python3")) +
                   glob.glob(os.path.expanduser("~/.pyenv/versions/3.10*/bin/python3")))
    found += [shutil.which(f"python3.{minor}") for minor in (10, 9, 8)]  # a pyenv shim may not run: checked
    return next((p for p in found if p and subprocess.run([p, "-V"], capture_output=True).returncode == 0), None)


def test_slurm_says_in_one_sentence_that_the_python_is_too_old(tmp_path):
    """C3: the install step's Python check, with a real Python 3.10 as PYTHON (srun is a stub that runs
    its command here): one sentence naming the version the pins need, before any pip or venv."""
    import sys
    old = older_python()
    if old is None:
        pytest.skip("no Python older than 3.11 on this machine (python3.10 or pyenv's 3.10)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node1\n")
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
           "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "42", "NPROC_PER_NODE": "1",
           "PYTHON": old, "VENV": str(tmp_path / "venv")}
    r = subprocess.run(["bash", str(SLURM)], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, r.stdout + r.stderr
    assert lines[0].startswith("error: ") and "older than the 3.11 numpy 2.4.6 needs" in lines[0], lines
    assert not (tmp_path / "venv").exists()
