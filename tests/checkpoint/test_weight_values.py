"""A weights file is checked for what it claims before any network takes its values
(segadv/checkpoint/loader.py ``check_weight_values``; docs/failures.md): integers where the model
has floating-point tensors, and NaN or infinity, are refused naming the first tensor; a file
needing pickled code is refused as such (segadv/checkpoint/io.py), whatever torch's wording."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from torch import nn

from segadv.checkpoint.io import _unpickling_error, needed_code, read_checkpoint
from segadv.checkpoint.loader import WeightValuesError, load_weights
from segadv.errors import UserError


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))


def saved(tmp_path, state) -> str:
    path = tmp_path / "w.pt"
    torch.save(state, path)
    return str(path)


def test_integer_weights_are_refused_naming_the_first_tensor(tmp_path):
    state = net().state_dict()
    state["0.weight"] = torch.ones_like(state["0.weight"], dtype=torch.int64)
    state["1.weight"] = torch.ones(4, dtype=torch.int64)
    model = net()
    before = model[0].weight.detach().clone()
    with pytest.raises(WeightValuesError, match=r"w\.pt: tensor '0\.weight' holds int64 values where a floating-point "
                                                r"weight belongs \(the model's is torch\.float32\) \(2 tensors"):
        load_weights(saved(tmp_path, state), model)
    assert torch.equal(model[0].weight, before)  # nothing loaded


def test_integer_buffers_and_half_precision_load(tmp_path):
    state = {k: (v.half() if v.is_floating_point() else v) for k, v in net().state_dict().items()}
    assert state["1.num_batches_tracked"].dtype == torch.int64
    model = net()
    load_weights(saved(tmp_path, state), model)
    assert model[1].num_batches_tracked.dtype == torch.int64


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_first_tensor(tmp_path, bad):
    state = net().state_dict()
    state["1.running_var"][2] = bad
    with pytest.raises(WeightValuesError, match=r"tensor '1\.running_var' holds non-finite values \((1 NaN, 0|0 NaN, 1) "
                                                r"infinite of 4\)"):
        load_weights(saved(tmp_path, state), net())


def test_a_file_needing_code_is_refused_as_such_not_as_corrupt(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    path = saved(tmp_path, {"w": Evil()})
    with pytest.raises(UserError, match=r"was refused: it needs arbitrary pickled code .*GLOBAL posix\.system\)"):
        read_checkpoint(path)


@pytest.mark.parametrize("message, name", [
    ("Weights only load failed.\nTrying to load unsupported GLOBAL posix.system whose module posix is blocked.", "posix.system"),
    ("WeightsUnpickler error: Unsupported global: GLOBAL builtins.print was not an allowed global by default.", "print"),
    ("WeightsUnpickler error: Unsupported class argparse.Namespace", "argparse.Namespace"),
    ("Can only build Tensor, Parameter, OrderedDict or types allowlisted via `add_safe_globals`, but got "
     "<class 'mymod.Box'>", "mymod.Box"),
    ("Can only create new object for nn.Parameter or classes allowlisted via `add_safe_globals` but got "
     "<class 'mymod.Box'>", "mymod.Box"),
    ("Trying to call reduce for unrecognized function <built-in function system>", "<built-in function system>"),
    ("``torch.distributed.tensor`` must be imported to load DTensors", "torch.distributed.tensor"),
])
def test_every_torch_wording_of_needed_code_is_recognised(tmp_path, message, name):
    assert needed_code(message)[0] == name
    err = _unpickling_error(tmp_path / "f.pt", pickle.UnpicklingError(message), legacy=False)
    assert "needs arbitrary pickled code" in str(err) and name in str(err)


def test_a_damaged_stream_is_still_corrupt(tmp_path):
    err = _unpickling_error(tmp_path / "f.pt", pickle.UnpicklingError("WeightsUnpickler error: Unsupported operand 149"),
                            legacy=False)
    assert "is corrupt" in str(err)
