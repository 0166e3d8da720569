"""Joining a job without torchrun (SLURM, or the variables by hand), the launcher's exit codes, and
the ``[rank N]`` log prefix: in-process, no second process needed."""

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from segadv.errors import UserError
from segadv.parallel import distributed
from segadv.parallel.distributed import DistEnv
from segadv.parallel.launch import child_pids, exit_code_of
from segadv.training.process import setup_logging
from segadv.signals import StopRequests


def test_slurm_jobs_get_a_port_of_their_own_and_master_port_overrides_it():
    assert distributed.default_port({"SLURM_JOB_ID": "4812345"}) == 17345
    assert distributed.default_port({"SLURM_JOB_ID": "77"}) == 15077
    assert distributed.default_port({}) == 29500
    environ = {"SLURM_JOB_ID": "4812345", "MASTER_PORT": "12000"}
    environ.setdefault("MASTER_PORT", str(distributed.default_port(environ)))
    assert environ["MASTER_PORT"] == "12000"


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_a_rendezvous_timeout_that_is_not_a_positive_number_is_a_user_error(value):
    with pytest.raises(UserError, match=f"SEGADV_RENDEZVOUS_TIMEOUT={value!r}"):
        distributed.rendezvous_seconds({"SEGADV_RENDEZVOUS_TIMEOUT": value})


def environ_for(port, **extra):
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "SEGADV_RENDEZVOUS_TIMEOUT": "1", **extra}


def test_a_taken_rendezvous_port_is_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match=f"rendezvous port {port} on 127.0.0.1 is taken.*set MASTER_PORT"):
            distributed.attempt_store(DistEnv(rank=0, world_size=2), environ_for(port))


def test_a_task_that_never_arrives_ends_the_wait_with_a_message():
    """SLURM_NTASKS=2 but one process started (python in an sbatch script without srun): rank 0
    waits SEGADV_RENDEZVOUS_TIMEOUT seconds, then says what is missing."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(UserError, match=r"only 1 of 2 processes reached the rendezvous .* within 1 s"):
        distributed.attempt_store(DistEnv(rank=0, world_size=2), environ_for(port))
    assert time.monotonic() - start < 30


def test_a_rank_that_cannot_reach_rank_0_says_so():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(UserError, match=f"rank 1 could not reach the rendezvous at 127.0.0.1:{port}"):
        distributed.attempt_store(DistEnv(rank=1, world_size=2), environ_for(port))


def test_log_lines_carry_the_rank_under_slurm(monkeypatch, capsys):
    monkeypatch.setattr(logging.root, "handlers", [])
    env = distributed.env_from({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1"})
    setup_logging(logging.INFO, env=env)
    logging.getLogger("segadv.test").warning("hello")
    assert "WARNING [rank 1] segadv.test: hello" in capsys.readouterr().err


@pytest.mark.parametrize("n", ["0", "-1"])
def test_nproc_per_node_below_1_exits_2(n, capsys):
    from segadv.cli.train import main

    assert main(["--nproc-per-node", n]) == 2
    assert f"--nproc-per-node {n}: give the number of processes to start, 1 or more" in capsys.readouterr().err


def test_the_launcher_exits_with_the_first_failed_ranks_code_and_128_plus_a_killing_signal():
    def failed(*codes_and_times):
        return SimpleNamespace(failures={rank: SimpleNamespace(exitcode=code, timestamp=when)
                                         for rank, (code, when) in enumerate(codes_and_times)})

    assert exit_code_of(failed((2, 10), (1, 11))) == 2
    assert exit_code_of(failed((-15, 12), (3, 11))) == 3  # rank 1 diverged; rank 0 got torchrun's SIGTERM
    assert exit_code_of(failed((-15, 11), (3, 11))) == 3  # ... within the same second
    assert exit_code_of(failed((-9, 10), (2, 11))) == 137  # SIGKILL (the OOM killer), as a shell reports it
    assert exit_code_of(failed((0, 10), (4, 11))) == 4


def test_the_launcher_finds_its_workers():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in child_pids(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_a_repeated_sigterm_is_one_stop_and_a_second_sigint_interrupts():
    with StopRequests() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # the job's and the launcher's
        assert stop.requested == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
