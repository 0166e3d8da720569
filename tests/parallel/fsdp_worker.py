"""Run under torchrun by tests/parallel/test_fsdp.py (not collected by pytest).

    torchrun --standalone --nproc-per-node 2 tests/parallel/fsdp_worker.py OUT_DIR

A small network sharded per unit over the ranks, each rank built from its own seed: rank 0 alone
runs forwards inside ``fsdp.gathered`` (as it alone draws an evaluation's panels, or holds one more
val batch), before the network's first training forward and again between two steps; then both
ranks take SGD steps on their halves of a batch. Each rank saves the gathered full state and what
rank 0's evaluation forwards returned; the test compares them with the same steps taken by one
process on the whole batch from rank 0's initial weights.
"""

import sys
from pathlib import Path

import torch
from torch import nn

from segadv.parallel import distributed, fsdp, parse_device_map


def network() -> nn.Module:
    """Every layer with parameters its own unit (the root holds none), so the first unit's backward
    prefetches whatever forward was recorded before the step's: rank 0's evaluation forwards, were
    they remembered, and rank 0 alone would all-gather. Two blocks of the same shapes: were the
    ranks to gather different blocks, the sizes would agree and the weights mix without an error."""
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 3))


def main(out: Path) -> None:
    env = distributed.env_from()
    distributed.init_process_group(env, parse_device_map("cpu"))
    torch.manual_seed(env.rank)  # each rank's own initialisation: sharding must start from rank 0's
    net = network()
    initial = {k: v.clone() for k, v in net.state_dict().items()}
    fsdp.broadcast_state(net)
    fsdp.shard_network(net, fsdp.device_mesh(torch.device("cpu")), units=["0", "2", "4", "5"])
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    mine = x[2 * env.rank: 2 * env.rank + 2]
    evaluated = []
    for step in range(3):
        with fsdp.gathered([net]), torch.no_grad():
            for _ in range(3 if env.rank == 0 else step % 2):  # uneven: rank 0 three, rank 1 none or one
                evaluated.append(net(x))
        net(mine).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.save({"initial": initial, "final": fsdp.full_state(net.state_dict()), "evaluated": evaluated,
                "sharded": fsdp.is_sharded(net)}, out / f"rank{env.rank}.pt")
    distributed.destroy_process_group(barrier_first=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
