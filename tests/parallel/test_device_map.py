import re

import pytest
import torch

from segadv.errors import UserError
from segadv.parallel import parse_device_map
from segadv.parallel.device_map import shown


def cuda(i):
    return torch.device("cuda", i)


CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "spec, count, g, d",
    [
        ("g:1,d:0", 2, cuda(1), cuda(0)),
        ("g:cuda:1,d:cuda:0", 2, cuda(1), cuda(0)),
        ("generator:cuda:1, discriminator:0", 2, cuda(1), cuda(0)),
        ("g:cuda:0,d:cpu", 1, cuda(0), CPU),
        ("g:cuda,d:cpu", 1, cuda(0), CPU),
        ("g:cpu,d:cpu", 0, CPU, CPU),
        ("g:cpu", 0, CPU, CPU),  # a role left out shares the other's device
        ("d:1", 2, cuda(1), cuda(1)),
        ("cpu", 0, CPU, CPU),  # a bare device: both networks
        ("cuda:1", 2, cuda(1), cuda(1)),
        ("1", 2, cuda(1), cuda(1)),
    ],
)
def test_parse(spec, count, g, d):
    device_map = parse_device_map(spec, cuda_device_count=count)
    assert (device_map.generator, device_map.devices_of("discriminator")[0]) == (g, d)


def test_default_follows_cuda_visibility():
    assert parse_device_map(None, cuda_device_count=0).generator == CPU
    both = parse_device_map("", cuda_device_count=2)
    assert both.generator == both.devices_of("discriminator")[0] == cuda(0)


@pytest.mark.parametrize(
    "spec, count, message",
    [
        ("g:1,d:0", 1, "cuda:1 requested for g, but only 1 CUDA device is visible"),
        ("g:1,d:0", 0, "cuda:1 requested for g, but no CUDA device is visible"),
        ("g:0,d:3", 2, "cuda:3 requested for d, but only 2 CUDA devices are visible"),
        ("x:0,d:0", 2, "unknown role 'x'"),
        ("g:0,generator:1", 2, "role 'generator' is given twice"),
        ("g:gpu1", 2, "unknown device 'gpu1' for g"),
        ("g1,d0", 2, "is not ROLE:DEVICE"),
        ("gpu", 2, "unknown device 'gpu' for g and d"),
        ("cuda:2", 2, "cuda:2 requested for g and d, but only 2 CUDA devices are visible"),
        ("g:0,,d:1", 2, "is not ROLE:DEVICE"),
        # torch keeps a device index in 8 bits: 256 would silently be cuda:0, 128-255 negative.
        ("g:1,d:256", 300, "CUDA index 256 for d is out of range (0 to 127)"),
        ("g:1,d:130", 300, "CUDA index 130 for d is out of range (0 to 127)"),
        ("g:²,d:0", 2, "unknown device '²' for g"),  # str.isdigit() accepts it, int() does not
        ("g:١,d:0", 2, "unknown device '١' for g"),  # an Arabic-Indic one, which int() would accept
        # A single entry ROLE:DEVICES is a role's, not a bare device: the role is what is wrong.
        ("student:cpu", 0, "unknown role 'student'"),
        ("student:0/1", 2, "unknown role 'student'"),
        # Pipeline stages (/): one device each, of one type, named for a role.
        ("g:0+1/2+3,d:0", 4, "g:0+1/2+3 puts a DataParallel replica set inside a pipeline stage"),
        ("g:cpu/0,d:0", 1, "g:cpu/0 mixes cpu and cuda stages"),
        ("g:0//1,d:1", 2, "g:0//1 has an empty stage"),
        ("0/1", 2, "stages (/) split one network; name it (e.g. g:0/1,d:1)"),
        ("g:0/2,d:1", 2, "cuda:2 requested for g, but only 2 CUDA devices are visible"),
    ],
)
def test_errors_name_the_problem(spec, count, message):
    with pytest.raises(UserError, match=re.escape(message)):
        parse_device_map(spec, cuda_device_count=count)


def test_replica_sets_and_local_rank_offsets():
    dm = parse_device_map("g:1+2,d:0", cuda_device_count=3)
    assert dm.devices_of("generator") == (cuda(1), cuda(2)) and dm.generator == cuda(1)
    assert dm.devices_of("discriminator") == (cuda(0),)
    # Local rank r shifts every index by r * (highest index + 1).
    rank1 = parse_device_map("g:0,d:1", cuda_device_count=4, local_rank=1)
    assert (rank1.generator, rank1.devices_of("discriminator")[0]) == (cuda(2), cuda(3))
    assert parse_device_map("g:0,d:cpu", cuda_device_count=2, local_rank=1).generator == cuda(1)
    assert parse_device_map("cpu", cuda_device_count=0, local_rank=3).generator == CPU
    assert parse_device_map(None, cuda_device_count=2, local_rank=1).generator == cuda(1)


def test_the_largest_index_is_kept_and_a_shift_past_it_refused():
    assert parse_device_map("g:127,d:0", cuda_device_count=128).generator == cuda(127)
    with pytest.raises(UserError, match="local rank 1 shifts g and d to CUDA index 129, beyond 127"):
        parse_device_map("cuda:63+64", cuda_device_count=300, local_rank=1)


def test_shown_names_a_stand_in_as_the_cuda_device_it_stands_for():
    assert shown(torch.device("meta", 3)) == "cuda:3" and shown(cuda(2)) == "cuda:2" and shown(CPU) == "cpu"


@pytest.mark.parametrize(
    "spec, count, rank, message",
    [
        ("g:1+cpu,d:0", 2, 0, "must list CUDA devices only"),
        ("g:1+1,d:0", 2, 0, "names a device twice"),
        ("g:0,d:1", 3, 1, "cuda:3 requested for d (cuda:1 shifted by local rank 1), but only 3 CUDA devices are visible"),
    ],
)
def test_replica_and_rank_errors(spec, count, rank, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_device_map(spec, cuda_device_count=count, local_rank=rank)


def test_dataparallel_on_the_host_never_moves_the_network_to_another_accelerator():
    """With an accelerator registered that the map does not name (segadv-plan's stand-in here; an
    XPU on a real machine), nn.DataParallel would move a CPU network onto it; segadv's falls through."""
    from torch import nn

    from segadv.config.schema import NetworkAmpConfig
    from segadv.parallel.wrap import wrap_network
    from segadv.plan import standin

    if not standin.available():
        pytest.skip("this torch build cannot register the stand-in backend")
    standin.register()
    net = nn.Conv2d(3, 2, 1)
    wrapped = wrap_network(net, "dp", (torch.device("cpu"),), NetworkAmpConfig(), broadcast_buffers=True)
    assert {p.device for p in net.parameters()} == {torch.device("cpu")}
    assert wrapped(torch.randn(1, 3, 4, 4)).device == torch.device("cpu")
    assert list(wrapped.state_dict()) == ["module.weight", "module.bias"]  # DataParallel's keys


def test_stages_enter_on_the_first_and_come_out_on_the_last():
    dm = parse_device_map("g:0/1,d:1,t:1", cuda_device_count=2)
    assert dm.stages_of("generator") == ((cuda(0),), (cuda(1),))
    assert dm.input_device("generator") == cuda(0)
    assert dm.devices_of("generator") == (cuda(1),) and dm.generator == cuda(1)  # output, losses, labels
    assert dm.stages_of("teacher") == ((cuda(1),),) and dm.devices == (cuda(0), cuda(1))
    # Left out: D takes a split G's last stage, the teacher G's stages.
    alone = parse_device_map("g:0/1", cuda_device_count=2)
    assert alone.stages_of("discriminator") == ((cuda(1),),)
    assert alone.stages_of("teacher") == ((cuda(0),), (cuda(1),))
    host = parse_device_map("g:cpu/cpu,d:cpu", cuda_device_count=0)
    assert host.stages_of("generator") == ((CPU,), (CPU,)) and host.is_split("generator")


@pytest.mark.parametrize("spec", ["g:cuda:0/cuda:1,d:cuda:1", "g:cpu/cpu,d:cpu", "g:cuda:1+cuda:2,d:cuda:0",
                                  "g:cuda:0/cuda:1/cuda:2,d:cuda:3,t:cuda:3"])
def test_str_round_trips(spec):
    dm = parse_device_map(spec, cuda_device_count=4)
    assert str(dm) == spec and parse_device_map(str(dm), cuda_device_count=4) == dm


def test_the_local_rank_shifts_every_stage():
    rank1 = parse_device_map("g:0/1,d:2", cuda_device_count=6, local_rank=1)
    assert rank1.stages_of("generator") == ((cuda(3),), (cuda(4),)) and rank1.devices_of("discriminator") == (cuda(5),)
    with pytest.raises(UserError, match=r"cuda:4 requested for g \(cuda:1 shifted by local rank 1\)"):
        parse_device_map("g:0/1,d:2", cuda_device_count=4, local_rank=1)
