"""AdvSemiSeg: the iteration's terms, its three streams, and training on them end to end.

The iteration is tested on tiny stand-in networks (a conv G without BatchNorm or dropout, the
real FC discriminator) with hand-fed streams, so each term can be recomputed independently.
"""

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from segadv.engine.losses import masked_cross_entropy, pseudo_labels
from segadv.methods.advsemiseg.iteration import AdvSemiSeg
from segadv.methods.advsemiseg.declaration import AdvSemiSegConfig, AdvSemiSegSetup
from segadv.models.discriminator import FCDiscriminator
from segadv.monitor.profile import PhaseTimer
from segadv.training.loop import train

from conftest import TINY_OVERRIDES
from data_builders import make_folder
from helpers import FixedStream, conv_networks, stream_positions

C, IGNORE = 3, 255


def make_method(seed=0, **settings):
    g, d = conv_networks(seed, FCDiscriminator, C, 0.1)
    values = dict(lambda_semi=1.0, mask_threshold=0.5, semi_start=0, lambda_semi_adv=0.1, semi_start_adv=0)
    values.update(settings)
    setup = AdvSemiSegSetup(num_classes=C, ignore_index=IGNORE, lambda_adv=0.1, adv_warmup_steps=0,
                            settings=AdvSemiSegConfig(**values))
    return AdvSemiSeg(setup, {"generator": g, "discriminator": d}, PhaseTimer())


def make_streams(seed=1, n=2, size=64):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, C, (n, size, size), generator=gen)
    labels[:, :2] = IGNORE
    gt = torch.randint(0, C, (n, size, size), generator=gen)
    return {
        "labeled": FixedStream((torch.randn(n, 3, size, size, generator=gen), labels)),
        "unlabeled": FixedStream(torch.randn(n + 1, 3, size, size, generator=gen)),
        "gt": FixedStream((torch.randn(n, 3, size, size, generator=gen), gt)),
    }


def test_masked_cross_entropy_and_pseudo_labels():
    logits = torch.randn(2, C, 4, 4)
    labels = torch.randint(0, C, (2, 4, 4))
    labels[0, 0] = IGNORE
    assert torch.allclose(masked_cross_entropy(logits, labels, IGNORE),
                          F.cross_entropy(logits, labels, ignore_index=IGNORE))
    nothing = torch.full_like(labels, IGNORE)
    assert masked_cross_entropy(logits, nothing, IGNORE).item() == 0.0  # not NaN

    confidence = torch.rand(2, 4, 4)
    confidence[0, 0, 0] = 0.5  # exactly at the threshold: kept
    pseudo = pseudo_labels(logits, confidence, 0.5, IGNORE)
    assert torch.equal(pseudo == IGNORE, confidence < 0.5)
    assert torch.equal(pseudo[confidence >= 0.5], logits.argmax(1)[confidence >= 0.5])


def test_pseudo_labels_are_masked_exactly_where_d_is_not_confident(monkeypatch):
    method, streams = make_method(), make_streams()
    g0, d0 = copy.deepcopy(method.g.module), copy.deepcopy(method.d.module)
    images_l, _ = streams["labeled"].batch
    images_u = streams["unlabeled"].batch
    with torch.no_grad():  # the same maps, recomputed by hand from the networks before the step
        logits_u = g0(images_u)
        confidence = torch.sigmoid(d0(torch.cat([g0(images_l), logits_u]).softmax(1))[len(images_l):]).squeeze(1)
    threshold = float(confidence.median())  # about half the pixels pass
    method.settings.mask_threshold = threshold

    seen = {}
    import segadv.methods.advsemiseg.iteration as module

    real = module.masked_cross_entropy
    monkeypatch.setattr(module, "masked_cross_entropy",
                        lambda logits, labels, ignore: (seen.update(labels=labels.clone()), real(logits, labels, ignore))[1])
    out = method(streams, step=0)
    expected = torch.where(confidence < threshold, torch.full_like(logits_u.argmax(1), IGNORE), logits_u.argmax(1))
    assert torch.equal(seen["labels"], expected)
    assert 0.3 < out["semi_pixel_ratio"].item() < 0.7
    assert out["semi_pixel_ratio"].item() == pytest.approx((expected != IGNORE).float().mean().item())


def test_d_real_maps_come_from_the_gt_stream_and_fakes_include_unlabeled():
    method, streams = make_method(), make_streams()
    inputs = []
    method.d.module.register_forward_hook(lambda m, args, out: inputs.append(args[0].detach()))
    method(streams, step=0)
    assert len(inputs) == 2  # G's view (D frozen), then D's own update
    d_update = inputs[1]
    n_l, n_u = len(streams["labeled"].batch[0]), len(streams["unlabeled"].batch)
    assert len(d_update) == n_l + n_u + n_l  # fake labeled + fake unlabeled + real
    real = d_update[n_l + n_u:]
    gt = streams["gt"].batch[1]
    assert torch.equal(real, F.one_hot(gt, C).permute(0, 3, 1, 2).float())
    assert all(s.drawn == 1 for s in streams.values())

    method, streams = make_method(d_sees_unlabeled=False), make_streams()
    inputs.clear()
    method.d.module.register_forward_hook(lambda m, args, out: inputs.append(args[0].detach()))
    method(streams, step=0)
    assert len(inputs[1]) == 2 * n_l


def test_unlabeled_stream_is_drawn_only_while_an_unlabeled_term_is_on():
    method, streams = make_method(semi_start_adv=3, semi_start=5, mask_threshold=0.0), make_streams()
    for step in range(6):
        out = method(streams, step)
        assert (out["loss_semi"].item() != 0) == (step >= 5)
        assert (out["loss_semi_adv"].item() != 0) == (step >= 3)
    assert streams["unlabeled"].drawn == 3 and streams["labeled"].drawn == streams["gt"].drawn == 6


@pytest.mark.parametrize("semi_start, semi_start_adv, lambda_semi_adv, drawn_from, semi_from", [
    (4, 0, 0.0, 0, 4),  # the pseudo-labels control: unlabeled forwarded (and shown to D) from step 0
    (1, 3, 0.1, 3, 3),  # the self-training term lives inside the unlabeled branch: it waits for it
])
def test_the_unlabeled_batch_follows_the_references_draw_rule(semi_start, semi_start_adv, lambda_semi_adv,
                                                                drawn_from, semi_from):
    """hfslyc/AdvSemiSeg train.py 330: the unlabeled batch is drawn and forwarded while lambda_semi
    or lambda_semi_adv is set, from semi_start_adv, whichever term is on; D sees it as fake (421-423)."""
    method = make_method(semi_start=semi_start, semi_start_adv=semi_start_adv, lambda_semi_adv=lambda_semi_adv,
                         mask_threshold=0.0)
    streams = make_streams()
    n_l, n_u = len(streams["labeled"].batch[0]), len(streams["unlabeled"].batch)
    fakes = []
    method.d.module.register_forward_hook(lambda m, args, out: fakes.append(len(args[0])) and None)
    for step in range(6):
        fakes.clear()
        out = method(streams, step)
        assert streams["unlabeled"].drawn == max(0, step + 1 - drawn_from)
        assert (out["loss_semi"].item() != 0) == (step >= semi_from)
        # D's own update scores fake (labeled + unlabeled while drawn) and real in one forward
        assert fakes[-1] == 2 * n_l + (n_u if step >= drawn_from else 0)


def test_no_confident_pixel_keeps_the_unlabeled_adversarial_term():
    """The reference drops the whole unlabeled loss when no pixel passes mask_T; segadv keeps the
    adversarial part (self-training contributes exactly zero)."""
    after = {}
    for lambda_semi_adv in (0.0, 0.5):
        method = make_method(mask_threshold=1.0, lambda_semi_adv=lambda_semi_adv)  # nothing passes
        out = method(make_streams(), step=0)
        assert out["semi_pixel_ratio"].item() == 0.0 and out["loss_semi"].item() == 0.0
        after[lambda_semi_adv] = [p.detach().clone() for p in method.g.module.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(after[0.0], after[0.5]))


# ------------------------------------------------------------------------- end to end


def semi_overrides(*extra):
    return [*TINY_OVERRIDES, "method.name=advsemiseg", "data.labeled_fraction=0.5",
            "method.advsemiseg.unlabeled_batch_size=3", "method.advsemiseg.semi_start_adv=2",
            "method.advsemiseg.semi_start=3", *extra]


def test_trains_logs_new_scalars_and_panel_and_checkpoints_stream_positions(tmp_path):
    from segadv.checkpoint import read_checkpoint
    from segadv.config import load_config

    cfg = load_config(None, semi_overrides("train.max_steps=4", "train.log_every=1"))
    cfg.run_dir, cfg.device_map = str(tmp_path / "run"), "cpu"
    train(cfg)
    run = tmp_path / "run"
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in logged if "train/loss_semi" in r][-1]
    assert {"train/loss_semi_adv", "train/semi_pixel_ratio", "perf/data_time/unlabeled"} <= set(last)
    # Does D know which pixels are right? Measured at each evaluation on unlabeled images' masks.
    diag = [r for r in logged if "diag/d_confidence_auroc" in r]
    assert [r["step"] for r in diag] == [2, 4]
    assert all(0 <= r["diag/d_confidence_auroc"] <= 1 and 0 <= r["diag/d_mask_pass"] <= 1 for r in diag)
    ckpt = read_checkpoint(run / "checkpoints" / "last.pt")
    # unlabeled drawn from step 2 on (semi_start_adv): steps 2 and 3
    assert stream_positions(ckpt) == {"labeled": 4, "unlabeled": 2, "gt": 4}

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0}).Reload()
    assert "train/unlabeled_confidence_pseudo" in events.Tags()["images"]


def test_panel_confidence_histogram_is_logged_at_each_evaluation_from_the_panels_maps(tmp_path, monkeypatch):
    from segadv.config import load_config
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    panels = []
    real_panel = AdvSemiSeg.panel

    def recorded_panel(self, images):
        panels.append(real_panel(self, images))
        return panels[-1]

    monkeypatch.setattr(AdvSemiSeg, "panel", recorded_panel)
    cfg = load_config(None, semi_overrides("train.max_steps=4", "log.diagnostic_images=0"))  # the panel's calls only
    cfg.run_dir, cfg.device_map = str(tmp_path / "run"), "cpu"
    train(cfg)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"histograms": 0}).Reload()
    histograms = events.Histograms("diag/d_confidence_unlabeled")
    assert [h.step for h in histograms] == [2, 4] and len(panels) == 2  # one panel (one D pass) per evaluation
    for histogram, maps in zip(histograms, panels):
        confidence = maps.confidence.double()
        assert confidence.shape == (2, 64, 64)  # log.num_images unlabeled images, every pixel
        value = histogram.histogram_value
        assert value.num == confidence.numel()
        assert (value.min, value.max, value.sum) == pytest.approx(
            (confidence.min().item(), confidence.max().item(), confidence.sum().item()), rel=1e-6)


def test_unlabeled_masks_are_never_read_in_training(tmp_path, monkeypatch):
    from segadv.config import load_config
    import segadv.data.files as files

    make_folder(tmp_path / "d", n_train=8, n_val=2, num_classes=3)
    cfg = load_config(None, semi_overrides(
        "data.kind=folder", f"data.root={tmp_path / 'd'}", "data.num_classes=3",
        "data.train_transforms=[{name: Resize, height: 32, width: 32}]",
        "data.val_transforms=[{name: Resize, height: 32, width: 32}]",
        "train.max_steps=4", "log.tensorboard=false"))
    cfg.run_dir, cfg.device_map = str(tmp_path / "run"), "cpu"
    split_ids = None
    opened = []
    real_open = files._open
    monkeypatch.setattr(files, "_open", lambda path, what: (opened.append(path), real_open(path, what))[1])
    train(cfg)
    split_ids = json.loads((tmp_path / "run" / "data_split.json").read_text())["unlabeled"]
    assert len(split_ids) == 4
    masks_opened = {p.stem for p in opened if p.parent.name == "masks"}
    assert masks_opened and not masks_opened & set(split_ids)


def test_needs_an_unlabeled_pool(tmp_path):
    from segadv.config import load_config
    from segadv.errors import UserError

    cfg = load_config(None, [*TINY_OVERRIDES, "method.name=advsemiseg"])
    cfg.run_dir, cfg.device_map = str(tmp_path / "run"), "cpu"
    with pytest.raises(UserError, match="data.labeled_fraction"):
        train(cfg)


def test_a_mask_quantile_ignores_that_share_of_the_least_confident_unlabeled_pixels():
    method, streams = make_method(mask_quantile=0.25), make_streams()
    out = method(streams, step=0)
    assert out["semi_pixel_ratio"].item() == pytest.approx(0.75, abs=1e-3)  # the quantile, not mask_threshold's 0.5
