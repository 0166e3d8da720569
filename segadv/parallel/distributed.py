"""The process group: who this process is (torchrun or SLURM), setting it up and tearing it down.

torchrun exports RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT.
Under ``srun`` without torchrun the same facts come from SLURM_PROCID / SLURM_LOCALID /
SLURM_NTASKS / SLURM_NTASKS_PER_NODE and the first host of SLURM_JOB_NODELIST.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

import torch
import torch.distributed as dist

from segadv.errors import UserError
from segadv.parallel.device_map import DeviceMap

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_from(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Read the launch variables (torchrun first, then SLURM); a plain run is rank 0 of 1."""
    env = os.environ if environ is None else environ
    try:
        if "RANK" in env and "WORLD_SIZE" in env:
            return DistEnv(
                rank=int(env["RANK"]),
                local_rank=int(env.get("LOCAL_RANK", 0)),
                world_size=int(env["WORLD_SIZE"]),
                local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            )
        if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
            return DistEnv(
                rank=int(env["SLURM_PROCID"]),
                local_rank=int(env.get("SLURM_LOCALID", 0)),
                world_size=int(env["SLURM_NTASKS"]),
                local_world_size=int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]),
            )
    except ValueError as err:
        raise UserError(f"malformed launch variables (RANK/WORLD_SIZE or SLURM_*): {err}") from None
    return DistEnv()


def launched_by_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a worker that torchrun (its elastic agent, the parent) started."""
    return "TORCHELASTIC_RUN_ID" in (os.environ if environ is None else environ)


def first_slurm_host(nodelist: str) -> str:
    """``node[03-05,9],gpu1`` -> ``node03``: the rendezvous host, without calling scontrol."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise UserError(f"cannot read SLURM_JOB_NODELIST {nodelist!r}")
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def backend_for(device_map: DeviceMap) -> str:
    """nccl when every network is on CUDA, gloo otherwise (gloo also works for CPU tensors)."""
    return "nccl" if all(d.type == "cuda" for d in device_map.devices) else "gloo"


DEFAULT_PORT = 29500
RENDEZVOUS_TIMEOUT_VARIABLE = "SEGADV_RENDEZVOUS_TIMEOUT"
DEFAULT_RENDEZVOUS_SECONDS = 300


def default_port(environ: Mapping[str, str]) -> int:
    """The rendezvous port when MASTER_PORT is not given: under SLURM 15000 + the job id's last
    four digits (Lightning's rule), so two jobs sharing a node do not collide; else 29500."""
    job = environ.get("SLURM_JOB_ID", "")
    return 15000 + int(job[-4:]) if job.isdigit() else DEFAULT_PORT


def rendezvous_seconds(environ: Mapping[str, str]) -> int:
    """How long the processes wait for each other to arrive (``SEGADV_RENDEZVOUS_TIMEOUT``)."""
    text = environ.get(RENDEZVOUS_TIMEOUT_VARIABLE, str(DEFAULT_RENDEZVOUS_SECONDS))
    try:
        seconds = int(text)
    except ValueError:
        seconds = 0
    if seconds < 1:
        raise UserError(f"{RENDEZVOUS_TIMEOUT_VARIABLE}={text!r}: give a whole number of seconds, 1 or more")
    return seconds


def init_process_group(env: DistEnv, device_map: DeviceMap, environ: dict[str, str] | None = None) -> None:
    """Join the group (a no-op for a single process). SLURM launches get MASTER_* filled in."""
    if not env.distributed or (dist.is_available() and dist.is_initialized()):
        return
    environ = os.environ if environ is None else environ
    if "MASTER_ADDR" not in environ and "SLURM_JOB_NODELIST" in environ:
        environ["MASTER_ADDR"] = first_slurm_host(environ["SLURM_JOB_NODELIST"])
    environ.setdefault("MASTER_PORT", str(default_port(environ)))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        environ.setdefault(key, str(getattr(env, key.lower())))
    if "MASTER_ADDR" not in environ:
        raise UserError("a multi-process run needs MASTER_ADDR: launch with torchrun (or srun under SLURM)")
    backend = backend_for(device_map)
    kwargs = {"device_id": device_map.generator} if backend == "nccl" else {}
    timeout = timedelta(minutes=30)
    dist.init_process_group(backend, store=attempt_store(env, environ), rank=env.rank,
                            world_size=env.world_size, timeout=timeout, **kwargs)
    log.info("process group: backend %s, rank %d/%d (local rank %d)", backend, env.rank, env.world_size, env.local_rank)


def attempt_store(env: DistEnv, environ: Mapping[str, str]) -> dist.Store:
    """The rendezvous store, with a key space of its own per elastic restart attempt.

    torchrun's agent hosts one store for the whole job; without a per-attempt prefix the workers
    of a restarted round can read the dead round's gloo/nccl addresses and fail to connect.
    Without torchrun (SLURM, or the variables set by hand) rank 0 hosts the store and waits
    ``SEGADV_RENDEZVOUS_TIMEOUT`` seconds for every process to arrive; a taken port, a missing
    process or an unreachable host is a UserError saying which. Its keys are prefixed with the
    SLURM job id, so a process that reaches another job's store never joins that job.
    """
    agent_hosts_store = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    host, port = environ["MASTER_ADDR"], int(environ["MASTER_PORT"])
    seconds = rendezvous_seconds(environ)
    if not agent_hosts_store:
        log.info("rendezvous at %s:%d: rank %d of %d, waiting up to %d s for the others (%s)",
                 host, port, env.rank, env.world_size, seconds, RENDEZVOUS_TIMEOUT_VARIABLE)
    try:
        store = dist.TCPStore(host, port, env.world_size, is_master=env.rank == 0 and not agent_hosts_store,
                              timeout=timedelta(seconds=seconds))
    except RuntimeError as err:  # torch's DistNetworkError / DistStoreError
        raise UserError(rendezvous_failure(err, env, host, port, seconds)) from None
    attempt = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    job = environ.get("SLURM_JOB_ID", "")
    return dist.PrefixStore(f"segadv/{job}/attempt_{attempt}/", store)


def rendezvous_failure(err: RuntimeError, env: DistEnv, host: str, port: int, seconds: int) -> str:
    """What a failed rendezvous means, in the user's terms."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "EADDRINUSE" in text or "address already in use" in text:
        return (f"rendezvous port {port} on {host} is taken (another job or run on this node?): set MASTER_PORT "
                "to a free port")
    joined = re.search(r"(\d+)/(\d+) clients joined", text)
    if joined:
        return (f"only {joined.group(1)} of {joined.group(2)} processes reached the rendezvous at {host}:{port} "
                f"within {seconds} s: start every rank (under SLURM: srun starts one per task, SLURM_NTASKS="
                f"{env.world_size}), or raise {RENDEZVOUS_TIMEOUT_VARIABLE}")
    return (f"rank {env.rank} could not reach the rendezvous at {host}:{port} within {seconds} s ({text}): is rank 0 "
            f"running, and are MASTER_ADDR / MASTER_PORT the same for every rank?")


def destroy_process_group(barrier_first: bool = False) -> None:
    """``barrier_first``: every rank reaches this point together (a finished run, an agreed stop):
    wait for the others first, so no rank tears its group down under a peer still using it (gloo
    then aborts that peer, and torchrun reports the abort instead of the run's exit code)."""
    if dist.is_available() and dist.is_initialized():
        if barrier_first:
            dist.barrier()
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def mean_over_ranks(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Average logged scalars across ranks (at log time only: this syncs)."""
    if not (dist.is_available() and dist.is_initialized()) or not values:
        return values
    if dist.get_backend() != "nccl":
        device = torch.device("cpu")
    tensor = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    tensor /= dist.get_world_size()
    return dict(zip(values, tensor.tolist()))


def any_rank(flag: bool) -> bool:
    """True on every rank if it is true on any (a stop request seen by one rank only)."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


class StepAgreement:
    """Whether any rank raised a flag (a stop request), agreed at every step without waiting.

    Each call all-reduces this step's flag asynchronously on a gloo group of its own (CPU tensors:
    no device sync, whatever the training backend) and returns the agreed value of the previous
    call's. Every rank gets the same answer at the same step, one step after the flag went up:
    a signal that reaches one rank stops every rank within two steps, whatever ``train.log_every``.
    A single process answers at once. :meth:`close` collects the last pending reduction.
    """

    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo") if dist.is_available() and dist.is_initialized() else None
        self._pending: tuple[dist.Work, torch.Tensor] | None = None
        self._settled = False  # the answer of a reduction collected early (settle)
        self._options = dist.AllreduceOptions()
        self._options.reduceOp = dist.ReduceOp.MAX
        self._buffers = (torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
        self._calls = 0

    def any(self, flag: bool) -> bool:
        if self.group is None:
            return flag
        agreed, self._settled = self._settled or self._collect(), False
        # Two buffers in turn (the other may still be in flight); the group's own allreduce, not
        # dist.all_reduce's wrapper: half the host time (tools/bench.py stop_agreement/*).
        self._calls += 1
        tensor = self._buffers[self._calls % 2]
        tensor.fill_(int(flag))
        self._pending = self.group.allreduce([tensor], self._options), tensor
        return agreed

    def settle(self) -> None:
        """Finish the reduction in flight now (its answer kept for the next call): before an
        evaluation forks its data-loader workers, so no collective is busy in another thread of
        the process while it forks."""
        self._settled = self._settled or self._collect()

    def close(self) -> None:
        self._collect()

    def _collect(self) -> bool:
        if self._pending is None:
            return False
        (work, tensor), self._pending = self._pending, None
        work.wait()
        return bool(tensor.item())


def check_ranks_agree(facts: Mapping[str, object], hint: str = "") -> None:
    """Every rank's ``facts`` (a name for each: config keys, ``--resume``, the world size) must
    equal rank 0's. Ranks launched with different settings would otherwise train apart in silence
    or hang in a collective that only some of them reach; instead every rank raises the same
    UserError, naming the first fact that differs and each rank's value (one all-gather)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    everyone: list = gather_objects(dict(facts))  # type: ignore[assignment]
    missing = object()
    reference = everyone[0]
    for rank, theirs in enumerate(everyone[1:], start=1):
        for key in [*reference, *(k for k in theirs if k not in reference)]:
            mine, other = reference.get(key, missing), theirs.get(key, missing)
            if mine != other:
                mine, other = ("(not set)" if v is missing else repr(v) for v in (mine, other))
                raise UserError(f"the ranks disagree on {key}: rank 0 has {mine}, rank {rank} has {other}; "
                                f"{hint or 'launch every rank with the same config, overrides and --resume'}")


def gather_objects(obj: object) -> object:
    """Every rank's ``obj`` as a list on every rank; the object itself when not distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def from_rank_zero(obj: object) -> object:
    """Rank 0's ``obj`` on every rank (each rank passes its own, ignored but on rank 0); the object
    itself when not distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_buffers(module: torch.nn.Module, src: int = 0) -> None:
    """Give every rank ``src``'s buffers (BatchNorm running statistics).

    DDP broadcasts buffers at the start of each forward, so after the last training step each
    rank's statistics hold one local update of their own: without this, ranks would evaluate (and
    could save) different models.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    for buffer in module.buffers():
        dist.broadcast(buffer, src)
