"""A network split into pipeline stages by the device map's ``/`` (segadv/parallel/pipeline.py):
placement by the network's own ``split``, checkpoints unchanged, what is refused."""

import logging

import pytest
import torch

from conftest import TINY_OVERRIDES
from helpers import FixedStream
from pipeline_toy import BLOCKS, ToySplitG, ToyUnsplittableG, use_toy_generator
from segadv.config import load_config
from segadv.errors import UserError
from segadv.parallel import parse_device_map, place_networks, unwrap
from segadv.parallel.pipeline import balanced_boundaries, check_boundaries, stage_devices
from segadv.parallel.placement import Misplaced
from segadv.training.build import build_training

CPU, META = torch.device("cpu"), torch.device("meta")


def tiny(*overrides):
    return load_config(None, [*TINY_OVERRIDES, *overrides])


def test_a_split_keeps_the_state_dict_keys_and_loads_an_unsplit_checkpoint_strictly():
    torch.manual_seed(0)
    whole, split = ToySplitG(3), ToySplitG(3)
    split.split([CPU, CPU])
    assert list(split.state_dict()) == list(whole.state_dict())  # buffers (running stats) too
    split.load_state_dict(whole.state_dict(), strict=True)
    whole.load_state_dict(split.state_dict(), strict=True)
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(split(x), whole(x))


def test_the_network_chooses_balanced_boundaries_and_given_ones_are_checked():
    assert balanced_boundaries([1] * 8, 2) == (4,) and balanced_boundaries([1] * 8, 3) == (3, 6)
    assert balanced_boundaries([10, 1, 1, 1], 2) == (1,)  # every later stage keeps a block
    assert balanced_boundaries([1, 1, 1, 10], 2) == (3,)
    assert check_boundaries([2], 4, 2) == (2,)
    for bad in ([0], [4], [2, 1], [1, 2]):
        with pytest.raises(UserError, match="need 1 increasing block indices between 1 and 3"):
            check_boundaries(bad, 4, 2)
    with pytest.raises(UserError, match="3 pipeline stages of a network of 2 blocks"):
        balanced_boundaries([1, 1], 3)


def test_placement_splits_by_the_map_and_logs_each_stages_parameters(caplog):
    torch.manual_seed(0)
    g = ToySplitG(3)
    device_map = parse_device_map("g:cpu/cpu,d:cpu", cuda_device_count=0)
    with caplog.at_level(logging.INFO, logger="segadv.parallel.placement"):
        place_networks([("generator", g, device_map.generator)], device_map)
    assert stage_devices(g) == (CPU, CPU)
    assert g._block_devices == (CPU,) * BLOCKS  # split by the network itself, not moved whole
    params = sum(p.numel() for p in g.parameters())
    assert f"generator on cpu/cpu (cpu {params:,} params)" in caplog.text


def test_a_split_network_is_placed_in_channels_last():
    g = ToySplitG(3)
    device_map = parse_device_map("g:cpu/cpu,d:cpu", cuda_device_count=0)
    place_networks([("generator", g, device_map.generator)], device_map, channels_last=True)
    assert stage_devices(g) == (CPU, CPU)
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in g.parameters() if p.dim() == 4)


def test_a_split_that_leaves_a_block_off_the_maps_devices_is_caught(monkeypatch):
    real = ToySplitG.split

    def astray(self, stage_devices, boundaries=None):
        real(self, stage_devices, boundaries)
        self.blocks[1].to(META)  # a device the map does not name

    monkeypatch.setattr(ToySplitG, "split", astray)
    device_map = parse_device_map("g:cpu/cpu,d:cpu", cuda_device_count=0)
    with pytest.raises(Misplaced, match=r"the generator's blocks\.1\.0\.weight is on meta, which the device map "
                                        r"does not give it \(cpu\)"):
        place_networks([("generator", ToySplitG(3), device_map.generator)], device_map)


def test_splitting_a_network_without_split_names_the_role_and_its_arch(monkeypatch):
    use_toy_generator(monkeypatch, ToyUnsplittableG)
    cfg = tiny("device_map=g:cpu/cpu,d:cpu")
    with pytest.raises(UserError) as caught:
        build_training(cfg, parse_device_map(cfg.device_map, cuda_device_count=0))
    message = str(caught.value)
    assert "\n" not in message
    assert "g:cpu/cpu splits the generator into 2 stages, but its network ToyUnsplittableG " \
           "(model.generator.arch=deeplabv3plus) cannot be split" in message


def test_a_split_generator_trains_with_its_output_and_losses_on_the_last_stage(monkeypatch):
    use_toy_generator(monkeypatch)
    cfg = tiny("device_map=g:cpu/cpu,d:cpu")
    device_map = parse_device_map(cfg.device_map, cuda_device_count=0)
    parts = build_training(cfg, device_map)
    assert stage_devices(parts.g.bare) == (CPU, CPU) and parts.g.devices == (CPU,)
    assert parts.g.module is parts.g.bare  # no wrapper: auto picks none for one process
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randn(2, 3, 64, 64, generator=gen), torch.randint(0, cfg.data.num_classes, (2, 64, 64), generator=gen))
    before = [p.detach().clone() for p in parts.g.bare.parameters()]
    parts.step({"labeled": FixedStream(batch)}, step=0)
    assert all(not torch.equal(a, b) for a, b in zip(before, parts.g.bare.parameters()) if b.requires_grad)


def test_dataparallel_of_a_split_network_is_refused(monkeypatch):
    use_toy_generator(monkeypatch)
    cfg = tiny("device_map=g:cpu/cpu,d:cpu", "parallel.generator=dp")
    with pytest.raises(UserError, match=r"parallel.generator=dp: the device map splits the generator into pipeline "
                                        r"stages, and DataParallel cannot replicate a split network"):
        build_training(cfg, parse_device_map(cfg.device_map, cuda_device_count=0))


def test_ddp_takes_a_split_network_without_device_ids(monkeypatch):
    """Under DDP each process holds its own split G: a module over several devices takes
    ``device_ids=None``."""
    from segadv.config.schema import NetworkAmpConfig
    from segadv.parallel import wrap

    seen = {}
    monkeypatch.setattr(wrap, "DistributedDataParallel", lambda module, **kwargs: seen.update(kwargs) or module)
    g = ToySplitG(3)
    g.split([CPU, CPU])
    wrap.wrap_network(g, "ddp", (CPU,), NetworkAmpConfig(), broadcast_buffers=True)
    assert seen["device_ids"] is None
    # A CUDA split: no device ids either (a whole network on cuda:1 gets [1]).
    g._stages = (torch.device("cuda", 0), torch.device("cuda", 1))
    wrap.wrap_network(g, "ddp", (torch.device("cuda", 1),), NetworkAmpConfig(), broadcast_buffers=True)
    assert seen["device_ids"] is None
    wrap.wrap_network(ToySplitG(3), "ddp", (torch.device("cuda", 1),), NetworkAmpConfig(), broadcast_buffers=True)
    assert seen["device_ids"] == [1]


def test_the_placement_table_shows_the_stages(monkeypatch):
    from segadv.parallel.report import network_row

    g = ToySplitG(3)
    g.split([CPU, CPU])
    assert network_row(0, "generator", g, (CPU,), None)["devices"] == "cpu/cpu"
