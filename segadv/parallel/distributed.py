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


def init_process_group(env: DistEnv, device_map: DeviceMap, environ: dict[str, str] | None = None) -> None:
    """Join the group (a no-op for a single process). SLURM launches get MASTER_* filled in."""
    if not env.distributed or (dist.is_available() and dist.is_initialized()):
        return
    environ = os.environ if environ is None else environ
    if "MASTER_ADDR" not in environ and "SLURM_JOB_NODELIST" in environ:
        environ["MASTER_ADDR"] = first_slurm_host(environ["SLURM_JOB_NODELIST"])
    environ.setdefault("MASTER_PORT", "29500")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        environ.setdefault(key, str(getattr(env, key.lower())))
    if "MASTER_ADDR" not in environ:
        raise UserError("a multi-process run needs MASTER_ADDR: launch with torchrun (or srun under SLURM)")
    backend = backend_for(device_map)
    kwargs = {"device_id": device_map.generator} if backend == "nccl" else {}
    timeout = timedelta(minutes=30)
    dist.init_process_group(backend, store=attempt_store(env, environ, timeout), rank=env.rank,
                            world_size=env.world_size, timeout=timeout, **kwargs)
    log.info("process group: backend %s, rank %d/%d (local rank %d)", backend, env.rank, env.world_size, env.local_rank)


def attempt_store(env: DistEnv, environ: Mapping[str, str], timeout: timedelta) -> dist.Store:
    """The rendezvous store, with a key space of its own per elastic restart attempt.

    torchrun's agent hosts one store for the whole job; without a per-attempt prefix the workers
    of a restarted round can read the dead round's gloo/nccl addresses and fail to connect.
    Without torchrun (SLURM) rank 0 hosts the store.
    """
    agent_hosts_store = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), env.world_size,
                          is_master=env.rank == 0 and not agent_hosts_store, timeout=timeout)
    attempt = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"segadv/attempt_{attempt}/", store)


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


def gather_objects(obj: object) -> object:
    """Every rank's ``obj`` as a list on every rank; the object itself when not distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


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
