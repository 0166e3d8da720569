"""The one inference loader (segadv/checkpoint/inference.py) and smp's save_pretrained directory,
both ways: a G trained here opens with smp.from_pretrained, and smp's directory loads here."""

import json

import pytest
import segmentation_models_pytorch as smp
import torch

from conftest import TINY_OVERRIDES
from segadv.cli import ckpt as ckpt_cli
from segadv.checkpoint.inference import load_generator
from segadv.config import config_to_dict, dump_config, load_config
from segadv.errors import UserError
from segadv.cli.eval import main as eval_main
from segadv.models import build_generator

G_OVERRIDES = [o for o in TINY_OVERRIDES if o.startswith("model.generator.")]
EVAL_OVERRIDES = ["data.synthetic.image_size=64", "data.synthetic.val_size=8", "data.val_batch_size=4"]


def tiny_generator(*overrides, seed=0):
    cfg = load_config(None, [*TINY_OVERRIDES, *overrides])
    torch.manual_seed(seed)
    return cfg, build_generator(cfg.model.generator, cfg.data.num_classes).eval()


def randomise_batchnorm(model, seed=1):
    """Non-trivial running statistics, so a buffer that does not travel changes the output."""
    gen = torch.Generator().manual_seed(seed)
    for name, buf in model.named_buffers():
        if name.endswith(("running_mean", "running_var")):
            buf.copy_(torch.rand(buf.shape, generator=gen) + 0.5)
    return model


def probe(seed=0):
    return torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(seed))


def save_checkpoint(path, cfg, generator):
    torch.save({"format": "segadv", "format_version": 1, "step": 3, "config": config_to_dict(cfg),
                "generator": generator.state_dict()}, path)
    return path


def test_a_state_dict_needs_a_config_and_loads_the_bare_generator(tmp_path):
    cfg, g = tiny_generator()
    randomise_batchnorm(g)
    raw = tmp_path / "g.pt"
    torch.save({f"module.{k}": v for k, v in g.state_dict().items()}, raw)
    with pytest.raises(UserError, match="carries no config"):
        load_generator(raw)
    config_file = tmp_path / "config.yaml"
    dump_config(cfg, config_file)
    loaded = load_generator(raw, str(config_file))
    assert loaded.kind == "state dict" and loaded.step is None and not loaded.model.training
    torch.testing.assert_close(loaded.model(probe()), g(probe()), rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["deeplabv3plus", "deeplabv3"])
def test_a_generator_trained_here_opens_with_smp_from_pretrained(tmp_path, arch, capsys):
    """segadv-ckpt convert --smp DIR; smp.from_pretrained(DIR) gives G's outputs. G here has
    dropped encoder stages (encoder_depth 4) and an aux head, neither of which smp knows."""
    cfg, g = tiny_generator(f"model.generator.arch={arch}", "model.generator.aux_head=true")
    randomise_batchnorm(g)
    ckpt = save_checkpoint(tmp_path / "last.pt", cfg, g)
    out = tmp_path / "smp"
    assert ckpt_cli.main(["convert", str(ckpt), "--smp", str(out)]) == 0
    assert "for smp.from_pretrained" in capsys.readouterr().out
    assert {"config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging left behind

    model = smp.from_pretrained(str(out)).eval()  # a local directory: nothing is downloaded
    assert type(model) is (smp.DeepLabV3Plus if arch == "deeplabv3plus" else smp.DeepLabV3)
    with torch.no_grad():
        torch.testing.assert_close(model(probe()), g(probe()), rtol=0, atol=0)  # the main output

    # ... and the directory loads back through segadv's loader, config from config.json.
    loaded = load_generator(out)
    assert loaded.kind == "smp directory" and loaded.cfg.model.generator.arch == arch
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(probe()), g(probe()), rtol=0, atol=0)


def test_converting_twice_writes_the_same_files(tmp_path):
    cfg, g = tiny_generator()
    ckpt = save_checkpoint(tmp_path / "last.pt", cfg, g)
    for name in ("a", "b"):
        assert ckpt_cli.main(["convert", str(ckpt), "--smp", str(tmp_path / name)]) == 0
    for file in ("config.json", "model.safetensors"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
    loaded = load_generator(ckpt)
    assert loaded.kind == "segadv checkpoint" and loaded.step == 3 and loaded.config_source.startswith("config saved")


@pytest.fixture
def smp_dir(tmp_path):
    """A directory written by smp itself, of a plain smp model at full encoder depth."""
    torch.manual_seed(0)
    model = smp.DeepLabV3Plus(encoder_name="mobilenet_v2", encoder_depth=4, encoder_weights=None,
                              encoder_output_stride=16, decoder_channels=64, classes=5).eval()
    randomise_batchnorm(model)
    model.save_pretrained(str(tmp_path / "smp"))
    return model, tmp_path / "smp"


def test_a_save_pretrained_directory_loads_evaluates_and_converts(smp_dir, tmp_path, capsys):
    model, directory = smp_dir
    loaded = load_generator(directory, overrides=EVAL_OVERRIDES)
    assert loaded.cfg.model.generator.encoder == "mobilenet_v2" and loaded.cfg.data.num_classes == 5
    assert loaded.sha256 and loaded.source_info()["checkpoint"] == str(directory)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(probe()), model(probe()), rtol=0, atol=0)

    # segadv-eval on the directory measures what it measures on the same weights as a state dict.
    assert ckpt_cli.main(["convert", str(directory), "--output", str(tmp_path / "g.pt")]) == 0
    dump_config(loaded.cfg, tmp_path / "config.yaml")
    capsys.readouterr()
    metrics = []
    for argv in (["--checkpoint", str(directory), *EVAL_OVERRIDES],
                 ["--checkpoint", str(tmp_path / "g.pt"), "--config", str(tmp_path / "config.yaml")]):
        assert eval_main([*argv, "--json", "--device", "cpu"]) == 0
        metrics.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert [m.pop("checkpoint") for m in metrics] == [str(directory), str(tmp_path / "g.pt")]
    assert metrics[0] == metrics[1]


def test_a_save_pretrained_directory_exports_to_onnx(smp_dir, tmp_path):
    pytest.importorskip("onnxruntime")
    from segadv.cli import export as export_cli
    from segadv.export.sidecar import sidecar_path

    _, directory = smp_dir
    assert export_cli.main(["--checkpoint", str(directory), "--output", str(tmp_path / "m.onnx"),
                            "--input-size", "64", "64", "--no-dynamic"]) == 0
    meta = json.loads(sidecar_path(tmp_path / "m.onnx").read_text())
    assert meta["source"]["kind"] == "smp directory" and meta["verification"]["passed"]


def test_a_config_that_disagrees_with_the_directory_is_a_user_error(smp_dir, tmp_path, capsys):
    _, directory = smp_dir
    config_file = tmp_path / "config.yaml"
    dump_config(load_config(None, [*G_OVERRIDES, "model.generator.encoder_depth=3"]), config_file)
    assert eval_main(["--checkpoint", str(directory), "--config", str(config_file)]) == 2
    err = capsys.readouterr().err
    assert str(directory / "config.json") in err and "encoder_depth: 4 in the directory, 3 in the config" in err
    assert "model.generator.encoder_depth" in err and "Traceback" not in err
    # The same through an override with no config file; the directory's own config loads.
    assert eval_main(["--checkpoint", str(directory), "data.num_classes=3"]) == 2
    assert "classes: 5 in the directory, 3 in the config (data.num_classes)" in capsys.readouterr().err


def test_a_directory_smp_describes_but_segadv_cannot_build_is_refused(smp_dir, capsys):
    _, directory = smp_dir
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "decoder_aspp_separable": False}))
    assert ckpt_cli.main(["convert", str(directory), "--output", str(directory / "g.pt")]) == 2
    assert "decoder_aspp_separable: False in the directory, True in the config (segadv's generator cannot set it)" \
        in capsys.readouterr().err
    (directory / "config.json").write_text(json.dumps({**config, "_model_class": "Unet"}))
    assert ckpt_cli.main(["convert", str(directory), "--output", str(directory / "g.pt")]) == 2
    assert "_model_class is 'Unet'" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["empty_dir", "no_weights", "bad_json", "missing_file"])
def test_bad_paths_exit_2_naming_them(tmp_path, case, capsys):
    target = tmp_path / "x"
    if case != "missing_file":
        target.mkdir()
    if case in ("no_weights", "bad_json"):
        (target / "config.json").write_text("{not json" if case == "bad_json" else "{}")
    if case == "bad_json":
        (target / "model.safetensors").write_bytes(b"")
    expected = {"empty_dir": "no config.json or model.safetensors", "no_weights": "no model.safetensors",
                "bad_json": "not readable JSON", "missing_file": "checkpoint not found"}[case]
    assert eval_main(["--checkpoint", str(target)]) == 2
    err = capsys.readouterr().err
    assert expected in err and str(target) in err and "Traceback" not in err


def test_smp_and_safetensors_do_not_combine(tmp_path, capsys):
    cfg, g = tiny_generator()
    ckpt = save_checkpoint(tmp_path / "last.pt", cfg, g)
    assert ckpt_cli.main(["convert", str(ckpt), "--smp", str(tmp_path / "d"), "--safetensors"]) == 2
    assert "--safetensors applies to --output" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert ckpt_cli.main(["convert", str(ckpt), "--smp", str(tmp_path / "file")]) == 2
    assert "is a regular file, not a folder" in capsys.readouterr().err


def test_inspect_reads_a_save_pretrained_directory(smp_dir, capsys):
    _, directory = smp_dir
    assert ckpt_cli.main(["inspect", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "segmentation generator" in out and "_model_class: DeepLabV3Plus" in out


def test_convert_to_smp_onto_a_full_disk_exits_4_and_leaves_no_folder(tmp_path, monkeypatch, capsys):
    """safetensors reports a full disk as its own error: the convert answers it as any failed
    write (exit 4, the folder named, ENOSPC) and removes the folder it made."""
    from safetensors import SafetensorError

    cfg, g = tiny_generator("model.generator.arch=deeplabv3plus")
    ckpt = save_checkpoint(tmp_path / "last.pt", cfg, g)

    def full_disk(self, *args, **kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')

    monkeypatch.setattr(smp.DeepLabV3Plus, "save_pretrained", full_disk)
    out = tmp_path / "smp"
    assert ckpt_cli.main(["convert", str(ckpt), "--smp", str(out)]) == 4
    err = capsys.readouterr().err
    assert f"cannot write {out}: No space left on device (ENOSPC)" in err and "Traceback" not in err
    assert not out.exists()
