"""train_gpu.py's checkpoints: torch.distributed.checkpoint (DCP) folders, saved by every process
and loaded safely on any number of processes.

OUT/checkpoints/step_NNNNNNNN/ holds each process's shards (__R_0.distcp), train_state.json (step,
model shape, scheme, the settings that shape the run) and DCP's .metadata, written last: a folder
without it is a save that was cut. The newest KEEP (2) complete ones are kept, and newest_loadable passes
over a newer one that fails the checks made before loading; a save that fails removes its folder and
raises SaveFailed on every process. A load calls nothing the files name outside an exact list and
changes no object it did not make:
- .metadata is a pickle, read with an exact allowlist of (module, name) pairs: DCP's record classes,
  torch.Size, OrderedDict, dtypes, a layout's lookup and a path; a dotted name (pickle protocol 4's
  way to reach an attribute of an attribute, e.g. `filesystem` + `os.system`) is refused, and so is
  pickle's BUILD (which sets attributes) on anything but a new instance of DCP's dataclasses: on
  PosixPath it would rebind a method for the whole process;
- the tensors and the optimizer's plain values with torch.load(weights_only=True).
Anything else that is wrong (a damaged, missing or truncated shard, another model's shapes, a folder
another program saved, a broken train_state.json) is refused in one sentence with exit status 1,
before the model is touched where it can be, and never as a traceback.

At the end of a run, export_weights gathers the shards with DCP's state_dict API into OUT/model.pt, one
plain state_dict. The run's record (run.json, log.jsonl) is run_log.py's.
"""
import contextlib
import io
import json
import pickle
import re
import shutil
from collections import OrderedDict
from pathlib import Path

import torch
import torch.distributed as dist

from arguments import refuse
from script_support import save_atomic, write_json

CKPT_DIR = "checkpoints"
STATE_NAME = "train_state.json"
EXPORT_NAME = "model.pt"
# complete checkpoints kept: one damaged after its save still leaves one. torchtitan refuses to keep fewer
# than 2 (torchtitan/components/checkpoint.py, keep_latest_k: "the last one may be in the process of being saved")
KEEP = 2
EXIT_SAVE_FAILED = 74  # EX_IOERR: a checkpoint could not be saved; train_gpu.py exits with it
SHARD_FILE = re.compile(r"__\d+_\d+\.distcp")  # what DCP's FileSystemWriter names its files

_DCP = "torch.distributed.checkpoint."
SAFE_GLOBALS = frozenset({
    *((_DCP + "metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
    (_DCP + "filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),  # a layout's name -> the layout
    ("collections", "OrderedDict"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),  # where it was saved
})


def step_dir(out: Path, step: int) -> Path:
    return Path(out) / CKPT_DIR / f"step_{step:08d}"


def complete_checkpoints(out: Path) -> list:
    """The checkpoint folders whose save finished (DCP writes .metadata last), oldest first."""
    root = Path(out) / CKPT_DIR
    if not root.is_dir():
        return []
    return sorted(d for d in root.glob("step_*") if (d / ".metadata").is_file() and (d / STATE_NAME).is_file())


def remove_partial_saves(out: Path, stale_files=()) -> None:
    """Remove what a run killed mid-save leaves: our checkpoint folders without .metadata, .tmp files."""
    out = Path(out)
    complete = set(complete_checkpoints(out))
    for d in sorted((out / CKPT_DIR).glob("step_*")) if (out / CKPT_DIR).is_dir() else []:
        if d not in complete:
            shutil.rmtree(d, ignore_errors=True)
            print(f"removed {CKPT_DIR}/{d.name}, a checkpoint whose save was cut (no .metadata)")
    for name in (EXPORT_NAME, *stale_files):
        stale = out / (name + ".tmp")
        if stale.exists():
            stale.unlink()
            print(f"removed {stale.name}, a partial file left by an interrupted run")


@contextlib.contextmanager
def single_process_quiet():
    """DCP warns that it 'assumes a single process' when there is no process group: that is the intent."""
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


class SaveFailed(Exception):
    """A checkpoint could not be saved; str() is the sentence for the reader. The step's folder is removed,
    the complete checkpoints before it are kept."""


def save(out: Path, step: int, state: dict, train_state: dict, rank: int, world: int, device=None) -> Path:
    """Save `state` (tensors, resharded by DCP on load) and train_state.json as the checkpoint of
    `step`, then remove all but the newest KEEP complete ones. A kill at any moment leaves the previous
    complete checkpoints; a save that fails (a full disk on any process: DCP's CheckpointException, a
    BaseException) raises SaveFailed on every process, its half-written folder removed. `device`: where
    the processes' failure flag is all-reduced (NCCL needs the GPU)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    path = step_dir(out, step)
    failure = None
    if rank == 0:
        try:
            shutil.rmtree(path, ignore_errors=True)  # a cut save of this very step, from an earlier run
            path.mkdir(parents=True)
            write_json(path / STATE_NAME, {"step": step, **train_state})
        except OSError as e:
            failure = (0, e)
    if world > 1:  # the barrier before DCP's writes, which also tells every process whether rank 0 failed
        flag = torch.tensor(int(failure is not None), device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        failure = failure or ((0, OSError("process 0 could not write train_state.json")) if flag.item() else None)
    if failure is None:
        try:
            with single_process_quiet():
                dcp.save(state, checkpoint_id=path, no_dist=world == 1)  # .metadata last: complete
        except (OSError, CheckpointException) as e:  # DCP raises CheckpointException on every process
            failures = getattr(e, "failures", None) or {rank: (e,)}
            failure = min((r, f[0]) for r, f in failures.items())  # the lowest rank's (exception, traceback)
    if failure is not None:
        # a full disk often shows only as torch.save's short write ("unexpected pos"): say how full it is
        free = shutil.disk_usage(path.parent).free / 2**20 if path.parent.is_dir() else 0.0
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)  # half-written: it must not count, and it holds space
        who, cause = failure
        why = (str(cause).strip().splitlines() or [type(cause).__name__])[-1][:200]
        kept = [d.name for d in complete_checkpoints(out) if d != path]
        raise SaveFailed(f"the checkpoint of step {step} could not be saved in {Path(out) / CKPT_DIR} (process {who}: "
                         f"{type(cause).__name__}: {why}; {free:,.2f} MiB were free there on process {rank}); "
                         + (f"the complete checkpoint(s) {', '.join(kept)} are kept, free space (or fix --out) and "
                            "continue with --resume" if kept else "no earlier checkpoint exists")
                         + f" (exit status {EXIT_SAVE_FAILED})")
    if world > 1:
        dist.barrier()
    if rank == 0:
        keep = complete_checkpoints(out)[-KEEP:]
        for old in (Path(out) / CKPT_DIR).glob("step_*"):
            if old not in keep:
                shutil.rmtree(old, ignore_errors=True)
    return path


BUILT = frozenset({*((_DCP + "metadata", name) for name in (  # DCP's dataclasses, a new instance per call
    "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
    "BytesStorageMetadata", "ChunkStorageMetadata")), (_DCP + "filesystem", "_StorageInfo")})


def _checked(check, load):
    return lambda unpickler: (check(unpickler), load(unpickler))


class SafeUnpickler(pickle._Unpickler):
    """Reads DCP's .metadata allowing exactly SAFE_GLOBALS and torch's dtypes, nothing else. Python's
    own unpickler, not the C one: a damaged memo index or length then fails instead of allocating it.

    The opcodes that change an object already on the stack act only on one this load made: BUILD (set
    attributes) on an instance of BUILT, never on a class, a function or an enum member (a BUILD on
    PosixPath would rebind its methods in the whole process); SETITEM(S), APPEND(S) and ADDITEMS on
    a plain dict, list or set (on anything else they call the object's own methods)."""

    def find_class(self, module, name):
        if "." not in name and ((module, name) in SAFE_GLOBALS or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint's metadata")

    def _changes(self, opcode: str, obj, kinds=None) -> None:
        kind = type(obj)
        if kind not in kinds if kinds else (kind.__module__, kind.__qualname__) not in BUILT:
            raise pickle.UnpicklingError(f"{opcode} on a {kind.__name__} is not allowed in a checkpoint's metadata")

    def _below_mark(self):  # what SETITEMS, APPENDS and ADDITEMS change: the object under the last MARK
        return self.metastack[-1][-1] if self.metastack and self.metastack[-1] else None

    CHANGES = {pickle.BUILD: lambda u: u._changes("BUILD", u.stack[-2]),
               pickle.SETITEM: lambda u: u._changes("SETITEM", u.stack[-3], (dict, OrderedDict)),
               pickle.SETITEMS: lambda u: u._changes("SETITEMS", u._below_mark(), (dict, OrderedDict)),
               pickle.APPEND: lambda u: u._changes("APPEND", u.stack[-2], (list,)),
               pickle.APPENDS: lambda u: u._changes("APPENDS", u._below_mark(), (list,)),
               pickle.ADDITEMS: lambda u: u._changes("ADDITEMS", u._below_mark(), (set,))}
    dispatch = {**pickle._Unpickler.dispatch, **{
        op[0]: _checked(check, pickle._Unpickler.dispatch[op[0]]) for op, check in CHANGES.items()}}


class Damaged(Exception):
    """A checkpoint folder that fails a check; str() is the sentence. The public readers refuse with it."""


def _refuse(path: Path, message) -> None:
    """refuse(message) about the checkpoint folder `path`, naming the complete one before it if one is kept."""
    path, message = Path(path), str(message)
    older = [d for d in complete_checkpoints(path.parent.parent) if d.name < path.name]
    if older:
        message += (f"; the checkpoint before it, {older[-1].name}, is kept: move {path.name} out of "
                    f"{CKPT_DIR}/ to resume from that one")
    refuse(message)


def newest_loadable(found: list, config: dict, say=print) -> tuple:
    """(folder, train_state) of the newest of the complete checkpoints `found` (oldest first) that passes
    read_train_state's checks. A newer one that fails them (damaged after its save) is named by `say` and
    passed over; if the oldest fails too, one sentence and exit 1."""
    for i in range(len(found) - 1, -1, -1):
        try:
            return found[i], _train_state(found[i], config)
        except Damaged as e:
            if i == 0:
                refuse(str(e))
            say(f"warning: {e}; resuming from the checkpoint before it, {found[i - 1].name}")


def remove_newer(out: Path, step: int) -> None:
    """Remove the checkpoints after `step`, the one a run resumes from: newest_loadable passed over them as
    damaged, and kept they would count among the KEEP newest in place of good ones."""
    for d in complete_checkpoints(out):
        if d.name > step_dir(out, step).name:
            shutil.rmtree(d, ignore_errors=True)
            print(f"removed {CKPT_DIR}/{d.name}, a damaged checkpoint after the one this run resumes from")


def read_metadata(path: Path):
    """DCP's Metadata of the checkpoint folder `path`, checked for what a load relies on; one
    sentence and exit 1 if it cannot be read safely."""
    try:
        return _metadata(path)
    except Damaged as e:
        _refuse(path, e)


def read_train_state(path: Path, config: dict) -> dict:
    """train_state.json of the checkpoint folder `path`, after checking that it belongs to this model
    and that every file its metadata names is there and long enough; one sentence and exit 1 if not."""
    try:
        return _train_state(path, config)
    except Damaged as e:
        _refuse(path, e)


def _metadata(path: Path):
    """read_metadata, raising Damaged."""
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
    try:
        # from memory: a length field in a damaged pickle reads short instead of allocating its length
        metadata = SafeUnpickler(io.BytesIO((Path(path) / ".metadata").read_bytes())).load()
        if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
            raise ValueError(f"it holds a {type(metadata).__name__}, not DCP's Metadata")
        for info in (metadata.storage_data or {}).values():
            name, offset, length = info.relative_path, info.offset, info.length
            if not (isinstance(name, str) and SHARD_FILE.fullmatch(name) and type(offset) is int
                    and type(length) is int and offset >= 0 and length >= 0):
                raise ValueError(f"it names a shard {str(name)[:40]!r} at {offset!r}+{length!r}")
        if not isinstance(getattr(metadata, "storage_meta", None), StorageMeta):
            metadata.storage_meta = StorageMeta()
    except Exception as e:  # anything a damaged pickle raises: nothing it names was called
        why = (str(e).splitlines() or [type(e).__name__])[0][:160]
        raise Damaged(f"--resume: {Path(path).name}/.metadata cannot be read safely ({type(e).__name__}: {why}); "
                      "it is damaged or was not written by torch.distributed.checkpoint") from None
    return metadata


def _train_state(path: Path, config: dict) -> dict:
    """read_train_state, raising Damaged (a model of another shape is refused at once: not damage)."""
    path = Path(path)
    try:
        state = json.loads((path / STATE_NAME).read_text(encoding="utf-8"))
        ok = (isinstance(state, dict) and type(state.get("step")) is int and state["step"] >= 0
              and type(state.get("world_size")) is int and state["world_size"] >= 1
              and state.get("shard") in ("ddp", "fsdp", "hsdp") and type(state.get("skipped_steps", 0)) is int
              and isinstance(state.get("settings", {}), dict))
    except (OSError, ValueError, RecursionError):
        ok = False
    if not ok:
        raise Damaged(f"--resume: {path.name}/{STATE_NAME} is not a train_gpu.py training state")
    if state.get("model_config") != config:
        refuse(f"--resume: the checkpoint's model {str(state.get('model_config'))[:200]} differs from this "
               f"run's {config}")
    files = {}
    for info in (_metadata(path).storage_data or {}).values():
        files[info.relative_path] = max(files.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(files.items()):
        f = path / name
        if not f.is_file() or f.stat().st_size < size:
            what = "missing" if not f.is_file() else "truncated"
            raise Damaged(f"--resume: shard file {path.name}/{name} is {what}; the checkpoint cannot be loaded")
    return state


def _safe_reader(path: Path):
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *a, **k):
            metadata = read_metadata(Path(self.path))
            metadata.storage_meta.load_id = self.load_id
            return metadata
    return SafeReader(path)


def _safe_planner():
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        """Non-tensor values (the optimizer's hyperparameters) with torch.load(weights_only=True)."""

        def load_bytes(self, read_item, value):
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._nested_dict import set_element
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj
    return SafePlanner()


def _fits(path: Path, target: dict) -> None:
    """Refuse, before loading, a checkpoint that lacks an entry of `target` or holds it in another shape."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    saved = read_metadata(path).state_dict_metadata
    for key, value in flatten_state_dict(target)[0].items():
        entry = saved.get(key)
        if entry is None:
            _refuse(path, f"--resume: {path.name} holds no {key}: it was not saved by train_gpu.py for this model")
        if torch.is_tensor(value) and (not isinstance(entry, TensorStorageMetadata)
                                       or tuple(entry.size) != tuple(value.shape)):
            size = tuple(entry.size) if isinstance(entry, TensorStorageMetadata) else "not a tensor"
            _refuse(path, f"--resume: {path.name} holds {key} as {size}, this run needs {tuple(value.shape)}")


def load(path: Path, target: dict, world: int, optional=()) -> None:
    """Load the checkpoint folder `path` into `target` (tensors sharded as this run shards them).
    optional: top-level entries of `target` that are dropped from it if the checkpoint has none."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    path = Path(path)
    saved = read_metadata(path).state_dict_metadata
    for key in optional:
        if key in target and not any(k.split(".")[0] == key for k in saved):
            del target[key]
    _fits(path, target)
    try:
        with single_process_quiet():
            dcp.load(target, checkpoint_id=path, storage_reader=_safe_reader(path), planner=_safe_planner(),
                     no_dist=world == 1)
    except (Exception, CheckpointException) as e:  # CheckpointException derives from BaseException
        failures = getattr(e, "failures", None)
        cause = next(iter(failures.values()))[0] if failures else e  # one rank's (exception, traceback)
        why = (str(cause).strip().splitlines() or [type(cause).__name__])[-1][:200]
        _refuse(path, f"--resume: {path.name} cannot be loaded, a shard is damaged ({type(cause).__name__}: {why})")


# ---- what train_gpu.py's Trainer `t` saves and restores (model, optimizer, sampler, loss scaler) ----

def checkpoint_state(t) -> dict:
    """What a checkpoint holds, as tensors (DCP reshards those): model and optimizer by parameter name,
    the sampler's and the CPU's RNG state, the GradScaler's scale and growth tracker."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(t.model, t.opt)
    model_sd.pop("lm_head.weight", None)  # tied to tok_emb.weight: the same matrix, saved once
    state = {"model": model_sd, "optim": optim_sd, "sampler_rng": t.sampler.gen.get_state(),
             "cpu_rng": torch.get_rng_state()}
    if t.scaler is not None:
        state["scaler"] = {"scale": torch.tensor(t.scaler.get_scale()),
                           "growth_tracker": torch.tensor(t.scaler._get_growth_tracker())}
    return state


def save_checkpoint(t, step: int, train_state: dict) -> Path:
    """Save train_gpu.py's Trainer `t` at `step`; train_state: what train_state.json holds beside the step."""
    train_state = {**train_state, "world_size": t.world, "skipped_steps": t.skipped,
                   "shard": t.args.shard if t.sharded else "ddp"}
    return save(t.args.out, step, checkpoint_state(t), train_state, t.rank, t.world, t.device)


def load_checkpoint(t, path: Path, state: dict) -> int:
    """Load a checkpoint saved on any number of processes under either scheme; return its step."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
    target = checkpoint_state(t)  # the shapes to load into, sharded as this run shards
    load(path, target, t.world, optional=("scaler",))  # a bf16 checkpoint has no scaler state
    # strict=False: only lm_head.weight is absent, and it is tok_emb.weight (tied)
    set_state_dict(t.model, t.opt, model_state_dict=target["model"], optim_state_dict=target["optim"],
                   options=StateDictOptions(strict=False))
    t.sampler.gen.set_state(target["sampler_rng"])
    torch.set_rng_state(target["cpu_rng"])
    if "scaler" in target:  # load_state_dict, not update(): the scaler has not scaled anything yet
        saved = t.scaler.state_dict()
        saved.update(scale=float(target["scaler"]["scale"]), _growth_tracker=int(target["scaler"]["growth_tracker"]))
        t.scaler.load_state_dict(saved)
    t.skipped = int(state.get("skipped_steps", 0))
    return state["step"]


def export_weights(model, out: Path, rank: int) -> None:
    """OUT/model.pt: the whole model as one plain state_dict on rank 0 (gathered from the shards)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        save_atomic(sd, Path(out) / EXPORT_NAME)  # GPT(cfg).load_state_dict(torch.load(...)) takes it
