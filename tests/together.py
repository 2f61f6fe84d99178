"""Independent launches run at the same time, for the fixtures that need several runs of a script.

A tiny training run spends most of its wall time starting: importing torch, torchrun's rendezvous, gloo's
connections, during which a core waits. Started together, the runs of one fixture overlap those waits;
each run is the command a test would start alone, with its own output folder, and is checked the same
way afterwards. At most SLOTS worker processes are in flight at once (a launch of more starts alone)."""
import os
import signal
import subprocess
import tempfile
import time

SLOTS = max(8, os.cpu_count() or 1)


def run_together(launches: dict, timeout: float = 300) -> dict:
    """{name: (argv, workers, env, cwd)} -> {name: CompletedProcess} (returncode, stdout, stderr; never
    raises on a non-zero exit: the caller checks). Launches start in the order given as slots free up; a
    launch that outlives `timeout` seconds from its start is killed with its workers (its session)."""
    pending, running, done = list(launches.items()), {}, {}
    try:
        while pending or running:
            busy = sum(r[1] for r in running.values())
            while pending and (not running or busy + pending[0][1][1] <= SLOTS):
                name, (argv, workers, env, cwd) = pending.pop(0)
                out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
                p = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=env, cwd=cwd,
                                     start_new_session=True)
                running[name] = (p, workers, out, err, time.monotonic())
                busy += workers
            for name, (p, _, out, err, t0) in list(running.items()):
                if p.poll() is None and time.monotonic() - t0 > timeout:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                if p.poll() is not None:
                    out.seek(0), err.seek(0)
                    done[name] = subprocess.CompletedProcess(p.args, p.returncode, out.read(), err.read())
                    out.close(), err.close()
                    del running[name]
            time.sleep(0.05)
    finally:
        for p, *_ in running.values():  # an error here: no launch is left behind
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return {name: done[name] for name in launches}
