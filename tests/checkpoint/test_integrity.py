"""Checkpoint integrity and formats (issue 33): every checkpoint is sealed with its sha256 and
verified on every load; a damaged file is named as corrupt, a foreign one as what it is, and only
pickled code is ever sent to --trust-checkpoint."""

from __future__ import annotations

import pickle
import random
import warnings

import pytest
import torch
from torch import nn

from segadv import __version__
from segadv.cli import ckpt as ckpt_cli
from segadv.cli import eval as eval_cli
from segadv.cli import train as train_cli
from segadv.checkpoint import read_checkpoint, save_checkpoint
from segadv.config import config_to_dict, load_config
from segadv.errors import UserError
from segadv.cli import export as export_cli
from segadv.fsutil import file_sha256
from segadv.models import build_discriminator, build_generator

from conftest import TINY_OVERRIDES


def flip(path, out, count=64):
    """``count`` bytes of ``path`` flipped in the middle (where the tensors are), written to ``out``."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(middle, middle + count):
        data[i] ^= 0xA5
    out.write_bytes(bytes(data))
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A segadv checkpoint as training writes it, and a copy of it with 64 flipped bytes."""
    folder = tmp_path_factory.mktemp("integrity")
    cfg = load_config(None, TINY_OVERRIDES)
    torch.manual_seed(0)
    state = {"format": "segadv", "format_version": 1, "segadv_version": __version__, "step": 7,
             "generator": build_generator(cfg.model.generator, cfg.data.num_classes).state_dict(),
             "discriminator": build_discriminator(cfg.model.discriminator, cfg.data.num_classes).state_dict(),
             "config": config_to_dict(cfg)}
    good = folder / "last.pt"
    save_checkpoint(state, good)
    return good, flip(good, folder / "flipped.pt"), state


def assert_corrupt_named(code, err, path):
    assert code == 2, err
    assert f"checkpoint {path} is corrupt" in err and "recorded in the file" in err
    assert "--trust-checkpoint" not in err and "weights_only" not in err and "Traceback" not in err


def test_a_checkpoint_carries_its_sha256_and_loads_exactly(checkpoints, capsys):
    good, _, state = checkpoints
    data = good.read_bytes()
    assert b"segadv-sha256:" in data[-100:]  # the zip comment
    loaded = read_checkpoint(good)
    assert loaded["step"] == 7 and torch.equal(loaded["generator"]["segmentation_head.0.weight"],
                                               state["generator"]["segmentation_head.0.weight"])
    assert ckpt_cli.main(["inspect", str(good)]) == 0
    out = capsys.readouterr().out
    # one sha256 shown for a file everywhere: the whole file's (segadv-export's sidecar names it too)
    assert f"sha256:    {file_sha256(good)} (the file's, as sha256sum prints it)" in out
    assert "integrity: sha256 sealed in the file: matches" in out and data[-64:].decode() not in out


def test_64_flipped_bytes_are_refused_by_eval_export_inspect_and_resume(checkpoints, tmp_path, capsys):
    _, flipped, _ = checkpoints
    before = file_sha256(flipped)
    runs = {
        "segadv-eval": lambda: eval_cli.main(["--checkpoint", str(flipped), "--device", "cpu"]),
        "segadv-export": lambda: export_cli.main(["--checkpoint", str(flipped), "--output", str(tmp_path / "m.pt")]),
        "segadv-ckpt inspect": lambda: ckpt_cli.main(["inspect", str(flipped)]),
        "segadv-train --resume": lambda: train_cli.main(["--run-dir", str(tmp_path / "run"), "--resume", str(flipped),
                                                         "--device-map", "cpu", *TINY_OVERRIDES]),
    }
    for name, run in runs.items():
        code = run()
        assert_corrupt_named(code, capsys.readouterr().err, flipped)
    assert not (tmp_path / "m.pt").exists() and file_sha256(flipped) == before


def test_resume_auto_with_only_damaged_checkpoints_stops_rather_than_starting_over(checkpoints, tmp_path, caplog):
    from segadv.checkpoint import CheckpointManager

    _, flipped, _ = checkpoints
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt").write_bytes(flipped.read_bytes())
    with pytest.raises(UserError, match=r"--resume auto: no checkpoint in .*checkpoints loads"):
        CheckpointManager(tmp_path, every=2).start("auto")
    assert "last.pt is corrupt" in caplog.text
    assert (tmp_path / "checkpoints" / "last.pt").is_file()  # not archived as an abandoned future


def test_a_file_without_a_seal_still_loads_and_its_zip_crcs_catch_damage(tmp_path):
    weights = {"w": torch.arange(4096, dtype=torch.float32)}
    plain = tmp_path / "mine.pth"
    torch.save(weights, plain)  # a user's own file: no sha256 in it
    assert torch.equal(read_checkpoint(plain)["w"], weights["w"])
    with pytest.raises(UserError, match=r"bad\.pth is corrupt: mine/data/0 in its zip archive fails its CRC-32"):
        read_checkpoint(flip(plain, tmp_path / "bad.pth"))


def test_any_noise_after_a_pickle_header_is_a_corrupt_checkpoint_not_a_traceback(tmp_path):
    """Random bytes after a pickle PROTO opcode make the unpickler fail in many ways (an empty
    stack, a missing memo key, a bad length, a bad string); every one is the corrupt-file message
    naming the file."""
    rng = random.Random(0)
    path = tmp_path / "noise.pt"
    for _ in range(300):
        path.write_bytes(b"\x80" + rng.randbytes(rng.randint(1, 4000)))
        with pytest.raises(UserError, match=r"noise\.pt is (truncated or )?corrupt: "):
            read_checkpoint(path)


def test_foreign_formats_and_payloads_get_their_own_message(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 4, 3))
    cases = {}
    torch.jit.save(torch.jit.script(model), tmp_path / "scripted.pt")
    cases["scripted.pt"] = "is a TorchScript module (torch.jit.save"
    torch.export.save(torch.export.export(model, (torch.zeros(1, 3, 8, 8),)), tmp_path / "program.pt2")
    cases["program.pt2"] = "is a torch.export program (torch.export.save, e.g. segadv-export --format exported)"
    torch.save(model, tmp_path / "module.pt")
    cases["module.pt"] = "holds a pickled Sequential model object (torch.save(model)), not weights"
    (tmp_path / "noise.pt").write_bytes(b"\x80" + random.Random(0).randbytes(4000))
    cases["noise.pt"] = "noise.pt is corrupt: not a readable pickle stream"
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07\x12\x07pytorch")
    cases["model.onnx"] = "is an ONNX model (segadv-export's output), not a checkpoint"
    (tmp_path / "x.pt").write_bytes(b"\x08\x07\x12\x07pytorch")  # told from its bytes, not its name
    cases["x.pt"] = "x.pt is an ONNX model (segadv-export's output), not a checkpoint"
    (tmp_path / "x.onnx").write_bytes(b"\x08\x07\x12\x07pyt")  # cut short: not ONNX, whatever its name
    cases["x.onnx"] = "x.onnx is truncated or corrupt, or of another format"
    (tmp_path / "empty.pt").write_bytes(b"")
    cases["empty.pt"] = "empty.pt is empty (0 bytes)"
    for name, message in cases.items():
        with pytest.raises(UserError) as raised:
            read_checkpoint(tmp_path / name)
        assert message in str(raised.value), (name, str(raised.value))
        if name != "module.pt":  # only pickled code may be trusted, and only on purpose
            assert "--trust-checkpoint" not in str(raised.value) and "weights_only" not in str(raised.value)
    trusted = read_checkpoint(tmp_path / "module.pt", trusted=True)  # its weights, when trusted
    assert torch.equal(trusted["0.weight"], model[0].weight)

    from safetensors.torch import save_file

    save_file({"w": torch.ones(3)}, tmp_path / "weights.pt")  # safetensors under a .pt name: read as such
    assert torch.equal(read_checkpoint(tmp_path / "weights.pt")["w"], torch.ones(3))


def test_pickled_code_is_sent_to_trust_and_nothing_else(tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("never",))

    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps({"generator": Payload()}, protocol=2))
    with pytest.raises(UserError, match=r"evil\.pt was refused: it needs arbitrary pickled code .*GLOBAL print\).*"
                                        r"--trust-checkpoint only for a file from a source you trust"):
        read_checkpoint(path)


@pytest.mark.parametrize("safetensors", [False, True])
def test_convert_seals_its_output_and_never_writes_over_its_input(checkpoints, tmp_path, safetensors, capsys):
    good, _, _ = checkpoints
    out = tmp_path / ("g.safetensors" if safetensors else "g.pt")
    extra = ["--safetensors"] if safetensors else []
    assert ckpt_cli.main(["convert", str(good), "--output", str(out), *extra]) == 0
    assert "sha256 sealed in the file: matches" in (capsys.readouterr(), ckpt_cli.main(["inspect", str(out)]),
                                                    capsys.readouterr().out)[2]
    with pytest.raises(UserError, match=r"g\.(pt|safetensors) is corrupt"):
        read_checkpoint(flip(out, out, count=16))

    copy = tmp_path / "last.pt"
    copy.write_bytes(good.read_bytes())
    before = (copy.read_bytes(), copy.stat().st_mtime_ns)
    assert ckpt_cli.main(["convert", str(copy), "--output", str(copy), *extra]) == 2
    err = capsys.readouterr().err
    assert f"--output {copy} is the checkpoint {copy}: nothing replaces an input" in err and "Traceback" not in err
    assert (copy.read_bytes(), copy.stat().st_mtime_ns) == before


def test_convert_to_an_smp_dir_seals_it_refuses_its_input_and_names_a_write_failure(checkpoints, tmp_path, capsys):
    good, _, _ = checkpoints
    (tmp_path / "a_file").write_text("not a folder")
    blocked = tmp_path / "a_file" / "smp"
    assert ckpt_cli.main(["convert", str(good), "--smp", str(blocked)]) == 4
    err = capsys.readouterr().err
    assert f"error: cannot write {blocked}: Not a directory (ENOTDIR)" in err and "Traceback" not in err

    smp = tmp_path / "smp"
    assert ckpt_cli.main(["convert", str(good), "--smp", str(smp)]) == 0
    assert ckpt_cli.main(["inspect", str(smp)]) == 0
    assert "sha256 sealed in the file: matches" in capsys.readouterr().out
    before = {p.name: p.read_bytes() for p in smp.iterdir()}
    assert ckpt_cli.main(["convert", str(smp), "--smp", str(smp)]) == 2
    assert f"--smp {smp} is the checkpoint {smp}: nothing replaces an input" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in smp.iterdir()} == before


@pytest.mark.parametrize("error", [TypeError("load() got an unexpected keyword argument 'weights_only'"),
                                   AttributeError("module 'torch' has no attribute 'UntypedStorage'")])
def test_a_torch_api_error_is_not_called_a_corrupt_file(tmp_path, monkeypatch, error):
    """A TypeError or AttributeError from torch's API around the unpickling (a torch whose
    ``load`` takes other arguments) says nothing about the file: it is not reported as corrupt."""
    path = tmp_path / "good.pt"
    torch.save({"w": torch.ones(2)}, path)

    def changed_load(*args, **kwargs):
        raise error

    monkeypatch.setattr(torch, "load", changed_load)
    with pytest.raises(type(error)) as raised:
        read_checkpoint(path)
    assert not isinstance(raised.value, UserError)


@pytest.mark.parametrize("trusted", [False, True])
def test_a_type_error_from_the_stream_is_a_corrupt_checkpoint(tmp_path, trusted):
    """A pickle stream that calls an allowed callable with the wrong arguments (OrderedDict(1, 2))
    fails with a TypeError inside the unpickling: that one is the file's."""
    path = tmp_path / "bad.pt"
    path.write_bytes(b"\x80\x02ccollections\nOrderedDict\nK\x01K\x02\x86R.")
    with pytest.raises(UserError, match=r"bad\.pt is corrupt: .*TypeError"):
        read_checkpoint(path, trusted=trusted)


def test_an_onnx_model_under_a_checkpoint_name_is_told_from_its_bytes(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    onnx.save(helper.make_model(graph, producer_name="segadv-test"), tmp_path / "x.pt")
    with pytest.raises(UserError, match=r"x\.pt is an ONNX model \(segadv-export's output\), not a checkpoint"):
        read_checkpoint(tmp_path / "x.pt")


def test_noise_after_a_pickle_header_warns_nothing_before_its_error(tmp_path):
    """torch's "Detected pickle protocol N" UserWarning (with a source line of its own) is no
    part of a corrupt file's answer: the error line is the only output."""
    path = tmp_path / "noise.pt"
    path.write_bytes(b"\x80\xf5" + random.Random(1).randbytes(4000))  # "protocol 245"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserError, match=r"noise\.pt is (truncated or )?corrupt: "):
            read_checkpoint(path)
