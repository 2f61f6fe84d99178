"""A real Slurm cluster of two nodes on this machine, for tests/test_slurm.py: Debian's slurm-wlm and
munge (`apt-get install slurm-wlm munge`, as .ci/run does), one munged, one slurmctld and two slurmd
(`-N book-n1`, `-N book-n2`), every node on 127.0.0.1 with a port of its own.

Kept apart from any Slurm or munge the machine already runs: its own slurm.conf (SLURM_CONF, set for every
command this module runs and inherited by the jobs), its own munge key and socket (AuthInfo=socket=...),
free ports, and every spool, state, pid and log file in one temporary folder. The daemons run as root
(slurmd starts each job as its user), through `sudo -n` where the tests are not root.

Each slurmd runs in a mount namespace of its own with a private tmpfs on `<root>/local`: a folder under it
is one folder per node, as /tmp or a local NVMe is on a real cluster (the test of an --out that is not
shared); everything else on the machine is one storage both nodes see.

The node names must resolve, as on a real cluster (the launch file rendezvouses at the first node's name):
`127.0.0.1 book-n1 book-n2` in /etc/hosts (.ci/run adds it; the tests skip and say so without it).
"""
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

NODES = ("book-n1", "book-n2")
HOSTS_LINE = "127.0.0.1 " + " ".join(NODES)
TICK_S = 30  # slurmctld's PERIODIC_TIMEOUT: how often it checks time limits and sends --signal's warning
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "unshare")


def why_not() -> str | None:
    """Why a cluster cannot start on this machine (a reason for pytest.skip), or None."""
    missing = [p for p in PROGRAMS if not shutil.which(p)]
    if missing:
        return f"no {', '.join(missing)} on this machine (apt-get install slurm-wlm munge)"
    if os.getuid() != 0 and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode != 0:
        return "the Slurm daemons need root (or passwordless sudo) to start jobs and mount a node's disk"
    for node in NODES:
        try:
            if socket.gethostbyname(node) != "127.0.0.1":
                raise OSError
        except OSError:
            return f"{node} does not resolve to 127.0.0.1: add the line `{HOSTS_LINE}` to /etc/hosts"
    return None


def free_ports(n: int) -> list:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Cluster:
    """start() it, then sbatch, job, wait_for; stop() ends every daemon it started, even after a failure."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or tempfile.mkdtemp(prefix="slurm-"))
        self.local = self.root / "local"  # a node-local tmpfs in each slurmd's mount namespace
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.sudo = [] if os.getuid() == 0 else ["sudo", "-n", "--preserve-env=SLURM_CONF"]
        self.procs = []
        self.tick_file = None

    def write_config(self) -> None:
        ctld, *node_ports = free_ports(1 + len(NODES))
        r = self.root
        nodes = "\n".join(f"NodeName={n} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 Port={p} CPUs=2 "
                          "RealMemory=10000" for n, p in zip(NODES, node_ports))
        self.conf.write_text(f"""\
ClusterName=booktest
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={ctld}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge.socket
StateSaveLocation={r}/state
SlurmctldLogFile={r}/slurmctld.log
SlurmctldPidFile={r}/slurmctld.pid
SlurmdSpoolDir={r}/spool-%n
SlurmdPidFile={r}/slurmd-%n.pid
SlurmdLogFile={r}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/builtin
JobRequeue=1
ReturnToService=2
MpiDefault=none
MinJobAge=600
KillWait=10
InactiveLimit=0
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")

    def start(self, timeout: float = 60) -> "Cluster":
        (self.root / "state").mkdir(parents=True, exist_ok=True)
        self.local.mkdir(exist_ok=True)
        self.root.chmod(0o755)  # munge checks that its socket's folder is not writable by others
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.write_config()
        self.daemon(["munged", "--foreground", "--force", f"--socket={self.root}/munge.socket",
                     f"--key-file={key}", f"--pid-file={self.root}/munged.pid", f"--log-file={self.root}/munged.log",
                     f"--seed-file={self.root}/munged.seed"], "munged")
        self.wait_for_path(self.root / "munge.socket", timeout)
        self.daemon(["slurmctld", "-D", "-i"], "slurmctld")
        for n in NODES:  # each node with its own mount namespace and a private disk on self.local
            self.daemon(["unshare", "-m", "--propagation", "private", "sh", "-c",
                         f"mount -t tmpfs tmpfs {self.local} && exec slurmd -D -N {n}"], f"slurmd-{n}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.node_states()
            if states and all(states.get(n, "").upper() == "IDLE" for n in NODES):
                return self
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm nodes did not become idle in {timeout:g} s: {self.node_states()}; "
                           f"see {self.root}/slurmctld.log and slurmd-*.log")

    def daemon(self, argv: list, name: str) -> None:
        with open(self.root / f"{name}.out", "w") as log:  # the daemon keeps its own copy of the handle
            self.procs.append(subprocess.Popen(self.sudo + argv, env=self.env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True))

    def wait_for_path(self, path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"{path} did not appear; see {self.root}")
            time.sleep(0.1)

    def stop(self) -> None:
        """End every job, then the daemons this cluster started (and nothing else)."""
        if self.conf.exists():
            for argv in (["scancel", "--user", str(os.getuid()), "--full"], ["scontrol", "shutdown"]):
                try:
                    self.run(argv, check=False)
                except subprocess.TimeoutExpired:  # no controller to answer: the daemons are ended below
                    pass
        for p in reversed(self.procs):  # slurmd, slurmctld (which shutdown ends), then munged
            for sig in ("TERM", "KILL"):
                try:
                    p.wait(timeout=0 if p is self.procs[0] and sig == "TERM" else 15)
                    break
                except subprocess.TimeoutExpired:  # its session is the daemon's (or sudo's) alone: end it
                    subprocess.run(self.sudo + ["kill", f"-{sig}", "--", f"-{p.pid}"], capture_output=True)
            p.wait(timeout=10)
        self.procs = []

    # ---- what the tests use --------------------------------------------------------------------------

    def run(self, argv: list, check=True, **kw) -> subprocess.CompletedProcess:
        r = subprocess.run(argv, env={**self.env, **kw.pop("env", {})}, capture_output=True, text=True,
                           timeout=60, **kw)
        if check and r.returncode:
            raise RuntimeError(f"{' '.join(argv)}: {r.stdout}{r.stderr}")
        return r

    def node_states(self) -> dict:
        r = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
        return dict(line.split()[:2] for line in r.stdout.splitlines() if len(line.split()) >= 2) if not \
            r.returncode else {}

    def sbatch(self, argv: list, env: dict, cwd: Path) -> str:
        """Submit; the job's id. `env` is the job's environment (sbatch exports it to the job)."""
        r = self.run(["sbatch", "--parsable", *argv], env=env, cwd=cwd)
        return r.stdout.strip().split(";")[0]

    def probe_ticks(self) -> None:
        """Submit a one-node job that records when slurmctld's check of time limits sends its --signal
        warning (due at once): that moment plus multiples of TICK_S are the checks to come. It runs beside
        the first two-node job (each node has 2 CPUs, a job of the tests takes 1)."""
        self.tick_file = self.root / "tick"
        self.run(["sbatch", "--nodes=1", "--time=1", "--signal=B:USR1@59", f"--output={self.root}/tick.log",
                  "--wrap", f"trap 'date +%s.%N > {self.tick_file}; exit 0' USR1; while :; do sleep 0.1; done"])

    def next_tick(self, after: float) -> float:
        """The wall time of slurmctld's first check of time limits after `after`."""
        deadline = time.monotonic() + 2 * TICK_S + 10
        while not self.tick_file.is_file() or not self.tick_file.read_text().strip():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no --signal warning within {2 * TICK_S + 10} s; see {self.root}/tick.log")
            time.sleep(0.2)
        seen = float(self.tick_file.read_text())
        return seen + max(0, -(-(after - seen) // TICK_S)) * TICK_S

    def job(self, job_id: str) -> dict:
        """The controller's record of the job (`scontrol show job`): JobState, Restarts, ExitCode, ..."""
        r = self.run(["scontrol", "show", "job", "-o", job_id])
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout))

    def wait_for(self, job_id: str, until, timeout: float, start_requeued=True) -> dict:
        """Poll the job until until(record) is true; a requeued job is started at once instead of after
        Slurm's two minutes (its BeginTime)."""
        deadline = time.monotonic() + timeout
        while True:
            j = self.job(job_id)
            if until(j):
                return j
            if start_requeued and j.get("JobState") == "PENDING" and j.get("Reason") == "BeginTime":
                self.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False)
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {j.get('JobState')} ({j.get('Reason')}) after {timeout:g} s")
            time.sleep(0.5)
