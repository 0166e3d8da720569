"""s4GAN: the iteration against a hand-written update, its whole-image self-training, what D sees,
its config checks, and exact resume end to end.

The iteration is tested on a tiny stand-in G (a conv net without BatchNorm or dropout) and the
real image-level D with its dropout on: each test seeds the CPU generator, and the hand-written
update runs D's forwards in the order the reference does (fake then real for G's loss, fake then
real for D's), so both draw the same dropout masks.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from segadv.config import load_config
from segadv.errors import UserError
from segadv.methods import method_class
from segadv.methods.s4gan.iteration import S4Gan
from segadv.methods.s4gan.declaration import S4GanConfig, S4GanSetup
from segadv.models.discriminator import ImageDiscriminator
from segadv.monitor.profile import PhaseTimer
from segadv.checkpoint import read_checkpoint
from segadv.training.loop import train

from conftest import TINY_OVERRIDES
from helpers import FixedStream, conv_networks, per_step_losses, resume_cfg, stream_positions

C, IGNORE, LR, SEED = 3, 255, 0.1, 7


def make_method(seed=0, **settings):
    g, d = conv_networks(seed, ImageDiscriminator, C, LR)
    values = dict(lambda_fm=1.0, lambda_st=1.0, threshold=0.5, st_start=0)
    values.update(settings)
    setup = S4GanSetup(num_classes=C, ignore_index=IGNORE, lambda_adv=0.0, settings=S4GanConfig(**values))
    return S4Gan(setup, {"generator": g, "discriminator": d}, PhaseTimer())


def make_streams(seed=1, n=2, n_u=3, size=32):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, C, (n, size, size), generator=gen)
    labels[:, :2] = IGNORE
    gt = torch.randint(0, C, (n, size, size), generator=gen)
    gt[:, -3:] = IGNORE
    return {
        "labeled": FixedStream((torch.randn(n, 3, size, size, generator=gen), labels)),
        "unlabeled": FixedStream(torch.randn(n_u, 3, size, size, generator=gen) * 2 + 1),
        "gt": FixedStream((torch.randn(n, 3, size, size, generator=gen), gt)),
    }


# ------------------------------------------------------------------------- the hand-written update


def to_unit(x):
    low, high = x.amin(dim=(1, 2, 3), keepdim=True), x.amax(dim=(1, 2, 3), keepdim=True)
    return (x - low) / (high - low)


def d_inputs(g, streams):
    """G's unlabeled logits and D's fake and real inputs, written out."""
    x_u = streams["unlabeled"].batch
    x_gt, y_gt = streams["gt"].batch
    logits_u = g(x_u)
    valid = (y_gt != IGNORE).float()[:, None]
    onehot = F.one_hot(y_gt.clamp(0, C - 1), C).permute(0, 3, 1, 2).float() * valid
    return logits_u, torch.cat([logits_u.softmax(1), to_unit(x_u)], 1), torch.cat([onehot, to_unit(x_gt)], 1)


def fake_scores(method, streams):
    """D's scores on the unlabeled images in G's update, as the iteration (seeded) will draw them."""
    g, d = copy.deepcopy(method.g.module), copy.deepcopy(method.d.module).train()
    with torch.no_grad():
        _, fake, _ = d_inputs(g, streams)
        torch.manual_seed(SEED)
        return torch.sigmoid(d(fake)[:, 0])


def expected_update(method, streams):
    """G and D after one iteration, from a plain loop on copies: the reference's losses, its
    optimizers, its order of D's forwards."""
    s = method.settings
    g, d = copy.deepcopy(method.g.module), copy.deepcopy(method.d.module).train()
    x_l, y_l = streams["labeled"].batch
    torch.manual_seed(SEED)
    loss_ce = F.cross_entropy(g(x_l), y_l, ignore_index=IGNORE)
    logits_u, fake, real = d_inputs(g, streams)
    for p in d.parameters():
        p.requires_grad_(False)
    d_fake, features_fake = d(fake, return_features=True)
    _, features_real = d(real, return_features=True)
    loss_fm = torch.mean(torch.abs(torch.mean(features_real, 0) - torch.mean(features_fake, 0)))
    loss_g = loss_ce + s.lambda_fm * loss_fm
    good = torch.sigmoid(d_fake[:, 0]) > s.threshold  # the reference's find_good_maps, whole images
    if good.any():
        loss_g = loss_g + s.lambda_st * F.cross_entropy(logits_u[good], logits_u[good].argmax(1))
    for p in d.parameters():
        p.requires_grad_(True)
    opt_g, opt_d = torch.optim.SGD(g.parameters(), lr=LR), torch.optim.SGD(d.parameters(), lr=LR)
    loss_g.backward()
    opt_g.step()

    def bce(out, label):
        return F.binary_cross_entropy_with_logits(out, torch.full_like(out, label))

    loss_d = (bce(d(fake.detach()), 0.0) + bce(d(real), 1.0)) / 2
    opt_d.zero_grad()
    loss_d.backward()
    opt_d.step()
    return g, d, int(good.sum())


def assert_same_parameters(actual, expected, atol=1e-6):
    """test_domain_adaptation.py's tolerance for its hand-written update."""
    for (name, a), b in zip(actual.named_parameters(), expected.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=atol, msg=lambda m: f"{name}: {m}")


def threshold_between(scores, passing):
    """A threshold that ``passing`` of the scores exceed."""
    ordered = scores.sort(descending=True).values
    return float((ordered[passing - 1] + ordered[passing]) / 2)


@pytest.mark.parametrize("passing", [0, 2, 3])
def test_one_iteration_equals_the_hand_written_update(passing):
    """G: CE + lambda_fm * feature matching + lambda_st * CE on the images D scores above the
    threshold; D: (BCE(fake, 0) + BCE(real, 1)) / 2. D's dropout is on, seeded on both sides."""
    method, streams = make_method(), make_streams()
    scores = fake_scores(method, streams)
    assert scores.unique().numel() == 3
    method.settings.threshold = {0: 1.0, 3: 0.0}[passing] if passing in (0, 3) else threshold_between(scores, passing)
    g, d, selected = expected_update(method, streams)
    assert selected == passing
    torch.manual_seed(SEED)
    out = method(streams, step=0)
    assert_same_parameters(method.g.module, g)
    assert_same_parameters(method.d.module, d)
    assert out["st_image_ratio"].item() == pytest.approx(passing / 3)
    assert (out["loss_st"].item() != 0) == (passing > 0)
    assert out["empty/loss_st"].item() == (passing == 0) and out["empty/loss_seg"].item() == 0
    assert set(out) == {"loss_seg", "loss_fm", "loss_st", "loss_d", "st_image_ratio", "d_acc_real", "d_acc_fake",
                        "empty/loss_seg", "empty/loss_st"}
    assert all(s.drawn == 1 for s in streams.values())


def test_self_training_takes_whole_images_above_the_threshold(monkeypatch):
    """The pseudo labels are G's argmax on every pixel of each image D scores above the
    threshold and ignored on every pixel of the others; none before st_start."""
    import segadv.methods.s4gan.iteration as module

    method, streams = make_method(st_start=1), make_streams()
    scores = fake_scores(method, streams)
    method.settings.threshold = threshold_between(scores, 1)
    with torch.no_grad():
        argmax = method.g.module(streams["unlabeled"].batch).argmax(1)
    seen = []
    real = module.masked_cross_entropy
    monkeypatch.setattr(module, "masked_cross_entropy",
                        lambda logits, labels, ignore: (seen.append(labels.clone()), real(logits, labels, ignore))[1])
    torch.manual_seed(SEED)
    out = method(streams, step=0)  # before st_start: the term is off (the one CE read is the labeled batch's)
    assert len(seen) == 1 and torch.equal(seen.pop(), streams["labeled"].batch[1])
    assert out["loss_st"].item() == 0.0 and out["st_image_ratio"].item() == pytest.approx(1 / 3)

    method, streams = make_method(st_start=1), make_streams()
    method.settings.threshold = threshold_between(scores, 1)
    torch.manual_seed(SEED)
    method(streams, step=1)
    _, labels = seen
    chosen = scores > method.settings.threshold
    assert chosen.sum() == 1
    assert torch.equal(labels[chosen], argmax[chosen])
    assert (labels[~chosen] == IGNORE).all()


def test_d_sees_only_unlabeled_predictions_as_fake():
    """D's four forwards: in G's update the unlabeled softmax with its images (gradient to G)
    and the gt stream's one-hot labels with theirs; in D's update the same two, detached. The
    labeled batch never reaches D."""
    method, streams = make_method(), make_streams()
    inputs = []
    method.d.module.register_forward_hook(lambda m, args, out: inputs.append(args[0]))
    with torch.no_grad():
        _, fake, real = d_inputs(copy.deepcopy(method.g.module), streams)
    method(streams, step=0)
    assert len(inputs) == 4
    assert [x.requires_grad for x in inputs] == [True, False, False, False]
    for got, expected in zip(inputs, (fake, real, fake, real)):
        torch.testing.assert_close(got.detach(), expected, rtol=0, atol=1e-6)
    assert torch.allclose(inputs[0][:, :C].sum(1), torch.ones(1))  # class maps: softmax
    images = inputs[0][:, C:].detach()
    assert float(images.amin()) == 0.0 and float(images.amax()) == 1.0  # images in [0, 1]


def check_method_config(cfg):
    method_class(cfg.method.name).check_config(cfg)


def test_the_image_discriminator_is_s4gans_alone():
    base = [*TINY_OVERRIDES, "data.labeled_fraction=0.5"]
    with pytest.raises(UserError, match="model.discriminator.kind: s4gan"):
        check_method_config(load_config(None, [*base, "method.name=s4gan"]))
    with pytest.raises(UserError, match="model.discriminator.kind: image is s4gan's"):
        check_method_config(load_config(None, [*base, "method.name=advsemiseg", "model.discriminator.kind=image"]))
    check_method_config(load_config(None, [*base, "method.name=s4gan", "model.discriminator.kind=image"]))


# ------------------------------------------------------------------------- end to end

S4GAN_LOSSES = ("train/loss_seg", "train/loss_fm", "train/loss_st", "train/loss_d", "train/st_image_ratio",
                "train/d_acc_real", "train/d_acc_fake")


@pytest.mark.parametrize("workers", [0, 2])
def test_s4gan_resumes_bitwise(tmp_path, workers):
    """7 steps in one go equal 5 + resume + 2, bitwise: three streams, D's dropout (the RNG state
    is in the checkpoint), the self-training term from step 3 on."""
    extra = [f"data.num_workers={workers}", "train.max_steps=7", "method.name=s4gan", "model.discriminator.kind=image",
             "data.labeled_fraction=0.5", "method.s4gan.unlabeled_batch_size=3", "method.s4gan.st_start=3",
             "method.s4gan.threshold=0.0"]
    full = train(resume_cfg(tmp_path, "full", *extra))
    first = train(resume_cfg(tmp_path, "split", *extra), stop_at=5)  # mid-epoch in every stream
    ckpt = read_checkpoint(tmp_path / "split" / "checkpoints" / "last.pt")
    assert stream_positions(ckpt) == {"labeled": 5, "unlabeled": 5, "gt": 5}
    second = train(resume_cfg(tmp_path, "split", *extra), resume="auto")
    assert (full.step, first.step, second.step) == (7, 5, 7)
    expected, got = per_step_losses(full.run_dir, S4GAN_LOSSES), per_step_losses(second.run_dir, S4GAN_LOSSES)
    assert sorted(got) == list(range(1, 8))
    assert got == expected
    assert expected[3][2] == 0 and expected[4][2] != 0  # self-training from step 3 (logged after it as step 4)
