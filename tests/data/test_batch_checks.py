"""Batches G cannot train on (BatchNorm on batch statistics) are refused before the first step,
naming the setting and the fix: batch, micro-batch, each stream's batch, each DataParallel
replica's chunk, and the last partial batch of an epoch with data.drop_last false."""

from __future__ import annotations

import pytest

from conftest import TINY_OVERRIDES
from segadv.config import load_config
from segadv.config.schema import GeneratorConfig
from segadv.data.batch_checks import check_last_batches, check_micro_batches, replica_chunks
from segadv.errors import UserError
from segadv.training.loop import train

DA_TARGET = ("target_data={kind: synthetic, synthetic: {domain: target, image_size: 64, train_size: 8, val_size: 2}, "
             "batch_size: 2, num_workers: 0}")


def start(tmp_path, *overrides):
    cfg = load_config(None, [*TINY_OVERRIDES, "device_map=g:cpu,d:cpu", "train.max_steps=1", "log.tensorboard=false",
                             *overrides])
    cfg.run_dir = str(tmp_path / "run")
    return train(cfg)


@pytest.mark.parametrize("overrides, named", [
    (["data.batch_size=1"], "data.batch_size=1"),
    (["data.batch_size=2", "train.accumulation_steps=2"], "train.accumulation_steps=2"),
    (["method.name=adaptsegnet", DA_TARGET, "method.adaptsegnet.target_batch_size=1"],
     "method.adaptsegnet.target_batch_size=1"),
    (["method.name=advsemiseg", "data.labeled_fraction=0.5", "method.advsemiseg.unlabeled_batch_size=1"],
     "method.advsemiseg.unlabeled_batch_size=1"),
    # 16 samples in batches of 3: a last batch of 1 at the end of every epoch
    (["data.drop_last=false", "data.batch_size=3"], "data.drop_last: false"),
])
def test_a_batch_of_one_is_refused_before_anything_trains(tmp_path, overrides, named):
    with pytest.raises(UserError, match="BatchNorm") as err:
        start(tmp_path, *overrides)
    assert named in str(err.value)
    assert not (tmp_path / "run" / "checkpoints" / "step_1.pt").exists()


def test_drop_last_false_with_a_full_last_batch_trains(tmp_path):
    result = start(tmp_path, "data.drop_last=false", "data.batch_size=4")  # 16 = 4 x 4
    assert result.step == 1


def test_micro_batches_and_replica_chunks():
    check_micro_batches({"data.batch_size": 4}, steps=2)
    with pytest.raises(UserError, match=r"data\.batch_size=4 cut into train\.accumulation_steps=4 micro-batches of 1"):
        check_micro_batches({"data.batch_size": 4}, steps=4)
    assert replica_chunks(3, 2) == [2, 1] and replica_chunks(4, 2) == [2, 2] and replica_chunks(5, 3) == [2, 2, 1]
    check_micro_batches({"data.batch_size": 4}, steps=1, replicas=2)
    with pytest.raises(UserError, match="DataParallel replicas get chunks of \\[2, 1\\]"):
        check_micro_batches({"data.batch_size": 3}, steps=1, replicas=2)


class _Loader:
    def __init__(self, samples, batch_size, drop_last):
        self.sampler, self.batch_size, self.drop_last = range(samples), batch_size, drop_last


def test_last_partial_batch():
    keys = {"labeled": "data.batch_size"}
    check_last_batches({"labeled": _Loader(7, 2, drop_last=True)}, keys, 1, True)  # dropped
    check_last_batches({"labeled": _Loader(7, 2, drop_last=False)}, keys, 1, False)  # no BatchNorm on batch stats
    check_last_batches({"labeled": _Loader(8, 3, drop_last=False)}, keys, 1, True)  # a last batch of 2
    with pytest.raises(UserError, match=r"last batch of 1 in every epoch .*\(7 samples per process, data\.batch_size=2\)"):
        check_last_batches({"labeled": _Loader(7, 2, drop_last=False)}, keys, 1, True)
    with pytest.raises(UserError, match="cannot cut into equal micro-batches"):  # whatever the norm
        check_last_batches({"labeled": _Loader(11, 4, drop_last=False)}, keys, 2, False)


def test_the_predicate_is_one_config_property():
    assert GeneratorConfig().trains_batch_statistics


def test_a_batch_of_one_trains_with_frozen_batchnorm_or_deeplabv2():
    """DeepLabV3's image pooling hands BatchNorm one value per channel; frozen BatchNorm uses its
    running statistics, and DeepLab-v2 pools nothing (the references train it at batch 1)."""
    assert not GeneratorConfig().trains_on_one_sample
    assert not GeneratorConfig(norm="frozen_affine").trains_on_one_sample
    assert GeneratorConfig(norm="frozen").trains_on_one_sample
    assert not GeneratorConfig(norm="frozen").trains_batch_statistics
    assert GeneratorConfig(arch="deeplabv2").trains_on_one_sample
    assert GeneratorConfig(arch="deeplabv2", norm="frozen_affine").trains_on_one_sample


def test_deeplabv2_refuses_a_batch_of_one_where_its_deepest_map_is_1x1():
    """Without image pooling DeepLab-v2 trains a batch of one, unless the image is so small that its
    deepest map is one cell: then BatchNorm sees one value per channel (torch's ValueError)."""
    from segadv.training.checks import check_accumulation, trains_on_one_sample

    v2 = ["model.generator.arch=deeplabv2", "model.generator.encoder_depth=5", "model.generator.output_stride=16",
          "data.kind=folder", "data.root=unused"]
    crop = "data.train_transforms=[{{name: RandomCrop, height: {0}, width: {0}}}]"
    assert GeneratorConfig(arch="deeplabv2").deepest_map(16, 17) == (1, 2)
    assert GeneratorConfig(arch="deeplabv2", layout="caffe", encoder="resnet50").deepest_map(16, 8) == (2, 1)
    cfg = load_config(None, [*v2, crop.format(16), "data.batch_size=1"])
    assert not trains_on_one_sample(cfg)
    with pytest.raises(UserError, match=r"RandomCrop to 16x16: model\.generator\.arch=deeplabv2 \(encoder_depth=5, "
                                        r"output_stride=16\) makes G's deepest feature map 1x1.*data\.batch_size=1"):
        check_accumulation(cfg)
    assert check_accumulation(load_config(None, [*v2, crop.format(16), "data.batch_size=2"])) == 2
    assert check_accumulation(load_config(None, [*v2, crop.format(32), "data.batch_size=1"])) == 1  # a 2x2 map
    assert trains_on_one_sample(load_config(None, [*v2, crop.format(16), "model.generator.norm=frozen"]))


def test_deeplabv2_at_a_batch_of_one_on_images_whose_own_size_gives_a_1x1_map_is_refused_at_start(tmp_path, capsys):
    """Folder images of 8x8 px kept at their own size (no crop: the config does not say their size)
    give DeepLab-v2 (stride 16) a 1x1 deepest map, where its BatchNorm on batch statistics sees one
    value per channel in a batch of one (torch's ValueError at the first step). The images' headers
    say so at start: exit 2 before the run dir exists, naming the split, the size, the norm, the
    batch and the fixes; larger images, a batch of two or frozen BatchNorm pass the same checks."""
    from data_builders import make_folder

    from segadv.cli import train as train_cli
    from segadv.parallel import parse_device_map
    from segadv.training import preflight

    for side in (8, 32):
        make_folder(tmp_path / f"images{side}", n_train=4, n_val=2, num_classes=3, h=side, w=side)

    def overrides(side, *extra):
        return ["model.generator.arch=deeplabv2", "model.generator.encoder=resnet18", "model.generator.encoder_depth=5",
                "model.generator.output_stride=16", "model.generator.norm=train", "data.kind=folder",
                f"data.root={tmp_path / f'images{side}'}", "data.num_classes=3", "data.batch_size=1",
                "data.train_transforms=[]", "data.num_workers=0", "train.max_steps=1", *extra]

    capsys.readouterr()
    code = train_cli.main(["--device-map", "g:cpu,d:cpu", "--run-dir", str(tmp_path / "run"), *overrides(8)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert ("the train split of data (4 of its 4 images, the first 'train_000' of 8x8 px): model.generator.arch="
            "deeplabv2 (encoder_depth=5, output_stride=16) makes G's deepest feature map 1x1 there, where its "
            "BatchNorm (model.generator.norm=train: batch statistics) has one value per channel in a batch of one, "
            "and data.batch_size=1: G's BatchNorm cannot train on a batch of one sample; use data.batch_size=2 or "
            "more (or model.generator.norm=frozen); or train on larger images (data.train_transforms)") in err
    assert not (tmp_path / "run").exists()
    for passing in (overrides(32), overrides(8, "data.batch_size=2"), overrides(8, "model.generator.norm=frozen")):
        preflight.check_start(load_config(None, passing), None, parse_device_map("g:cpu,d:cpu"))
