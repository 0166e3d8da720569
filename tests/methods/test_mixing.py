"""segadv/methods/mixing.py held to transcriptions of the references' functions, plus behaviour.

The transcriptions below are the references' logic, copied and marked with the repository, the
commit and the lines read; the only adaptation is where their randomness comes from: the draws
that the function under test took from its torch.Generator are replayed (same seed, same calls)
and handed to the transcription in place of ``np.random`` / ``random`` / kornia's global RNG.

    DACS            vikolss/DACS                    cc6a87f23b1c81ae32edad767b9772258774a974
    French et al.   Britefury/cutmix-semisup-seg    af6183a6b3d7711a1da37e14e1e9daf31ed3208f
    kornia 0.5.8    kornia/kornia tag 0.5.8         8b619aea49a6b93b703e84586ed535f58e3685e9
    (DACS's kornia version is unpinned; lhoyer/DAFormer e6f6e041, which transcribes DACS, pins 0.5.8)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from segadv.methods import mixing

SEED = 1234


def _gen(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# =================================================================================================
# Transcriptions (reference code; adapted only to take the replayed draws)
# =================================================================================================

# --- DACS utils/transformmasks.py lines 56-59 -----------------------------------------------------
def ref_generate_class_mask(pred, classes):
    pred, classes = torch.broadcast_tensors(pred.unsqueeze(0), classes.unsqueeze(1).unsqueeze(2))
    N = pred.eq(classes).sum(0)
    return N


# --- DACS trainUDA.py lines 425-435 (the per-image class choice) ----------------------------------
# ``np.random.choice(nclasses, k, replace=False)`` is (legacy numpy) ``permutation(nclasses)[:k]``;
# the permutation is passed in: ``choice_perm(image_i, nclasses)`` returns it.
def ref_class_masks(labels, choice_perm):
    masks = []
    for image_i in range(labels.shape[0]):
        classes = torch.unique(labels[image_i])
        #classes=classes[classes!=ignore_label]
        nclasses = classes.shape[0]
        #if nclasses > 0:
        classes = (classes[torch.Tensor(choice_perm(image_i, nclasses)[:int((nclasses + nclasses % 2) / 2)]).long()])
        masks.append(ref_generate_class_mask(labels[image_i], classes).unsqueeze(0))
    return masks


# --- DACS utils/transformsgpu.py lines 66-74 ------------------------------------------------------
def ref_oneMix(mask, data=None, target=None):
    #Mix
    if not (data is None):
        stackedMask0, _ = torch.broadcast_tensors(mask[0], data[0])
        data = (stackedMask0*data[0]+(1-stackedMask0)*data[1]).unsqueeze(0)
    if not (target is None):
        stackedMask0, _ = torch.broadcast_tensors(mask[0], target[0])
        target = (stackedMask0*target[0]+(1-stackedMask0)*target[1]).unsqueeze(0)
    return data, target


# --- French et al. mask_gen.py lines 46-117 (BoxMaskGenerator) -------------------------------------
class ReplayRng:
    """Stands in for ``np.random``: ``uniform(low, high, size)`` is numpy's ``low + (high - low) *
    random_sample(size)`` on the replayed U[0, 1) draws, in call order."""

    def __init__(self, draws):
        self.draws = list(draws)

    def uniform(self, low=0.0, high=1.0, size=None):
        u = self.draws.pop(0)
        assert u.shape == tuple(size)
        return low + (high - low) * u


class RefBoxMaskGenerator:
    def __init__(self, prop_range, n_boxes=1, random_aspect_ratio=True, prop_by_area=True, within_bounds=True, invert=False):
        if isinstance(prop_range, float):
            prop_range = (prop_range, prop_range)
        self.prop_range = prop_range
        self.n_boxes = n_boxes
        self.random_aspect_ratio = random_aspect_ratio
        self.prop_by_area = prop_by_area
        self.within_bounds = within_bounds
        self.invert = invert

    def generate_params(self, n_masks, mask_shape, rng=None):
        if rng is None:
            rng = np.random

        if self.prop_by_area:
            # Choose the proportion of each mask that should be above the threshold
            mask_props = rng.uniform(self.prop_range[0], self.prop_range[1], size=(n_masks, self.n_boxes))

            # Zeros will cause NaNs, so detect and suppres them
            zero_mask = mask_props == 0.0

            if self.random_aspect_ratio:
                with np.errstate(divide="ignore", invalid="ignore"):  # (added: numpy 2 warns)
                    y_props = np.exp(rng.uniform(low=0.0, high=1.0, size=(n_masks, self.n_boxes)) * np.log(mask_props))
                    x_props = mask_props / y_props
            else:
                y_props = x_props = np.sqrt(mask_props)
            fac = np.sqrt(1.0 / self.n_boxes)
            y_props *= fac
            x_props *= fac

            y_props[zero_mask] = 0
            x_props[zero_mask] = 0
        else:
            if self.random_aspect_ratio:
                y_props = rng.uniform(self.prop_range[0], self.prop_range[1], size=(n_masks, self.n_boxes))
                x_props = rng.uniform(self.prop_range[0], self.prop_range[1], size=(n_masks, self.n_boxes))
            else:
                x_props = y_props = rng.uniform(self.prop_range[0], self.prop_range[1], size=(n_masks, self.n_boxes))
            fac = np.sqrt(1.0 / self.n_boxes)
            y_props *= fac
            x_props *= fac

        sizes = np.round(np.stack([y_props, x_props], axis=2) * np.array(mask_shape)[None, None, :])

        if self.within_bounds:
            positions = np.round((np.array(mask_shape) - sizes) * rng.uniform(low=0.0, high=1.0, size=sizes.shape))
            rectangles = np.append(positions, positions + sizes, axis=2)
        else:
            centres = np.round(np.array(mask_shape) * rng.uniform(low=0.0, high=1.0, size=sizes.shape))
            rectangles = np.append(centres - sizes * 0.5, centres + sizes * 0.5, axis=2)

        if self.invert:
            masks = np.zeros((n_masks, 1) + mask_shape)
        else:
            masks = np.ones((n_masks, 1) + mask_shape)
        for i, sample_rectangles in enumerate(rectangles):
            for y0, x0, y1, x1 in sample_rectangles:
                masks[i, 0, int(y0):int(y1), int(x0):int(x1)] = 1 - masks[i, 0, int(y0):int(y1), int(x0):int(x1)]
        return masks


# --- kornia 0.5.8: kornia/color/hsv.py lines 7-106 --------------------------------------------------
def ref_rgb_to_hsv(image, eps=1e-6):
    maxc, _ = image.max(-3)
    maxc_mask = image == maxc.unsqueeze(-3)
    _, max_indices = ((maxc_mask.cumsum(-3) == 1) & maxc_mask).max(-3)
    minc = image.min(-3)[0]
    v = maxc  # brightness
    deltac = maxc - minc
    s = deltac / (v + eps)
    # avoid division by zero
    deltac = torch.where(deltac == 0, torch.ones_like(deltac, device=deltac.device, dtype=deltac.dtype), deltac)
    maxc_tmp = maxc.unsqueeze(-3) - image
    rc = maxc_tmp[..., 0, :, :]
    gc = maxc_tmp[..., 1, :, :]
    bc = maxc_tmp[..., 2, :, :]
    h = torch.stack([bc - gc, 2.0 * deltac + rc - bc, 4.0 * deltac + gc - rc], dim=-3)
    h = torch.gather(h, dim=-3, index=max_indices[..., None, :, :])
    h = h.squeeze(-3)
    h = h / deltac
    h = (h / 6.0) % 1.0
    h = 2 * math.pi * h
    return torch.stack([h, s, v], dim=-3)


def ref_hsv_to_rgb(image):
    h = image[..., 0, :, :] / (2 * math.pi)
    s = image[..., 1, :, :]
    v = image[..., 2, :, :]
    hi = torch.floor(h * 6) % 6
    f = ((h * 6) % 6) - hi
    one = torch.tensor(1.0).to(image.device)
    p = v * (one - s)
    q = v * (one - f * s)
    t = v * (one - (one - f) * s)
    hi = hi.long()
    indices = torch.stack([hi, hi + 6, hi + 12], dim=-3)
    out = torch.stack((v, q, p, p, t, v, t, v, v, q, p, p, p, p, t, v, v, q), dim=-3)
    out = torch.gather(out, -3, indices)
    return out


# --- kornia 0.5.8: kornia/enhance/adjust.py (saturation 35-109, hue 112-190, contrast 268-325,
# brightness 328-380; type checks dropped) -----------------------------------------------------------
def _unsq(factor, input):
    for _ in range(len(input.shape) - len(factor.shape)):
        factor = torch.unsqueeze(factor, dim=-1)
    return factor


def ref_adjust_saturation(input, saturation_factor):
    x_hsv = ref_rgb_to_hsv(input)
    saturation_factor = _unsq(saturation_factor.to(input.device).to(input.dtype), x_hsv)
    h, s, v = torch.chunk(x_hsv, chunks=3, dim=-3)
    s_out = torch.clamp(s * saturation_factor, min=0, max=1)
    return ref_hsv_to_rgb(torch.cat([h, s_out, v], dim=-3))


def ref_adjust_hue(input, hue_factor):
    x_hsv = ref_rgb_to_hsv(input)
    hue_factor = _unsq(hue_factor.to(input.device, input.dtype), x_hsv)
    h, s, v = torch.chunk(x_hsv, chunks=3, dim=-3)
    divisor = 2 * math.pi
    h_out = torch.fmod(h + hue_factor, divisor)
    return ref_hsv_to_rgb(torch.cat([h_out, s, v], dim=-3))


def ref_adjust_contrast(input, contrast_factor):
    contrast_factor = _unsq(contrast_factor.to(input.device).to(input.dtype), input)
    x_adjust = input * contrast_factor
    return torch.clamp(x_adjust, 0.0, 1.0)


def ref_adjust_brightness(input, brightness_factor):
    brightness_factor = _unsq(brightness_factor.to(input.device).to(input.dtype), input)
    x_adjust = input + brightness_factor
    return torch.clamp(x_adjust, 0.0, 1.0)


# --- kornia 0.5.8: kornia/augmentation/augmentation.py lines 249-264 (ColorJitter.apply_transform) --
def ref_kornia_color_jitter(input, params):
    transforms = [
        lambda img: ref_adjust_brightness(img, params['brightness_factor'] - 1),
        lambda img: ref_adjust_contrast(img, params['contrast_factor']),
        lambda img: ref_adjust_saturation(img, params['saturation_factor']),
        lambda img: ref_adjust_hue(img, params['hue_factor'] * 2 * math.pi),
    ]
    jittered = input
    for idx in params['order'].tolist():
        t = transforms[idx]
        jittered = t(jittered)
    return jittered


# --- DACS utils/transformsgpu.py lines 7-18 (colorJitter): ``seq(data)`` is kornia's ColorJitter
# with its random parameters replaced by ``params`` ---------------------------------------------------
def ref_colorJitter(colorJitter, img_mean, data=None, target=None, s=0.25, params=None):
    # s is the strength of colorjitter
    #colorJitter
    if not (data is None):
        if data.shape[1]==3:
            if colorJitter > 0.2:
                img_mean, _ = torch.broadcast_tensors(img_mean.unsqueeze(0).unsqueeze(2).unsqueeze(3), data)
                # was: seq = nn.Sequential(kornia.augmentation.ColorJitter(brightness=s,contrast=s,saturation=s,hue=s))
                seq = lambda d: ref_kornia_color_jitter(d, params)  # noqa: E731
                data = (data+img_mean)/255
                data = seq(data)
                data = (data*255-img_mean).float()
    return data, target


# --- kornia 0.5.8: filters/kernels.py 15-23, 336-361, 424-461; filters/filter.py 10-107;
# filters/gaussian.py 10-43 (checks dropped) --------------------------------------------------------
def ref_gaussian(window_size, sigma):
    x = torch.arange(window_size).float() - window_size // 2
    if window_size % 2 == 0:
        x = x + 0.5
    gauss = torch.exp((-x.pow(2.0) / (2 * sigma ** 2)))
    return gauss / gauss.sum()


def ref_get_gaussian_kernel2d(kernel_size, sigma):
    ksize_x, ksize_y = kernel_size
    sigma_x, sigma_y = sigma
    kernel_x = ref_gaussian(ksize_x, sigma_x)
    kernel_y = ref_gaussian(ksize_y, sigma_y)
    return torch.matmul(kernel_x.unsqueeze(-1), kernel_y.unsqueeze(-1).t())


def ref_compute_padding(kernel_size):
    computed = [k // 2 for k in kernel_size]
    out_padding = 2 * len(kernel_size) * [0]
    for i in range(len(kernel_size)):
        computed_tmp = computed[-(i + 1)]
        if kernel_size[i] % 2 == 0:
            padding = computed_tmp - 1
        else:
            padding = computed_tmp
        out_padding[2 * i + 0] = padding
        out_padding[2 * i + 1] = computed_tmp
    return out_padding


def ref_filter2d(input, kernel, border_type='reflect'):
    b, c, h, w = input.shape
    tmp_kernel = kernel.unsqueeze(1).to(input)
    tmp_kernel = tmp_kernel.expand(-1, c, -1, -1)
    height, width = tmp_kernel.shape[-2:]
    padding_shape = ref_compute_padding([height, width])
    input_pad = F.pad(input, padding_shape, mode=border_type)
    tmp_kernel = tmp_kernel.reshape(-1, 1, height, width)
    input_pad = input_pad.view(-1, tmp_kernel.size(0), input_pad.size(-2), input_pad.size(-1))
    output = F.conv2d(input_pad, tmp_kernel, groups=tmp_kernel.size(0), padding=0, stride=1)
    return output.view(b, c, h, w)


def ref_gaussian_blur2d(input, kernel_size, sigma, border_type='reflect'):
    kernel = torch.unsqueeze(ref_get_gaussian_kernel2d(kernel_size, sigma), dim=0)
    return ref_filter2d(input, kernel, border_type)


# --- DACS utils/transformsgpu.py lines 20-30 (gaussian_blur); ``np.random.uniform(0.15,1.15)`` is
# the replayed ``sigma`` ----------------------------------------------------------------------------
def ref_gaussian_blur(blur, data=None, target=None, sigma=None):
    if not (data is None):
        if data.shape[1]==3:
            if blur > 0.5:
                #sigma = np.random.uniform(0.15,1.15)
                kernel_size_y = int(np.floor(np.ceil(0.1 * data.shape[2]) - 0.5 + np.ceil(0.1 * data.shape[2]) % 2))
                kernel_size_x = int(np.floor(np.ceil(0.1 * data.shape[3]) - 0.5 + np.ceil(0.1 * data.shape[3]) % 2))
                kernel_size = (kernel_size_y, kernel_size_x)
                seq = lambda d: ref_gaussian_blur2d(d, kernel_size, (sigma, sigma))  # nn.Sequential(kornia.filters.GaussianBlur2d(...))
                data = seq(data)
    return data, target


# --- DACS trainUDA.py lines 421-422 and 466-479 (pixel_weight == "threshold_uniform"; .cuda() dropped)
def ref_dacs_weights(logits_u_w, targets_u, MixMask0, MixMask1):
    pseudo_label = torch.softmax(logits_u_w.detach(), dim=1)
    max_probs, targets_u_w = torch.max(pseudo_label, dim=1)
    unlabeled_weight = torch.sum(max_probs.ge(0.968).long() == 1).item() / np.size(np.array(targets_u.cpu()))
    pixelWiseWeight = unlabeled_weight * torch.ones(max_probs.shape)
    onesWeights = torch.ones((pixelWiseWeight.shape))
    _, pixelWiseWeight0 = ref_oneMix(MixMask0, target=torch.cat((onesWeights[0].unsqueeze(0), pixelWiseWeight[0].unsqueeze(0))))
    _, pixelWiseWeight1 = ref_oneMix(MixMask1, target=torch.cat((onesWeights[1].unsqueeze(0), pixelWiseWeight[1].unsqueeze(0))))
    pixelWiseWeight = torch.cat((pixelWiseWeight0, pixelWiseWeight1))
    return max_probs, targets_u_w, pixelWiseWeight


# --- DACS utils/loss.py lines 35-43 (CrossEntropyLoss2dPixelWiseWeighted, as trainUDA.py 240 builds it)
class RefCrossEntropyLoss2dPixelWiseWeighted(nn.Module):
    def __init__(self, weight=None, ignore_index=250, reduction='none'):
        super().__init__()
        self.CE = nn.CrossEntropyLoss(weight=weight, ignore_index=ignore_index, reduction=reduction)

    def forward(self, output, target, pixelWiseWeight):
        loss = self.CE(output, target)
        loss = torch.mean(loss * pixelWiseWeight)
        return loss


# --- French et al. train_seg_semisup_mask_mt.py lines 401-451 (cut/mix shared part; cons_loss_fn 'var';
# ``conf_rate_acc`` bookkeeping dropped) ------------------------------------------------------------------
def ref_french_consistency(logits_cons_stu, logits_cons_tea, loss_mask, conf_thresh=0.97, conf_per_pixel=False):
    prob_cons_tea = F.softmax(logits_cons_tea, dim=1)
    prob_cons_stu = F.softmax(logits_cons_stu, dim=1)
    if conf_thresh > 0.0:
        conf_tea = prob_cons_tea.max(dim=1)[0]
        conf_mask = (conf_tea >= conf_thresh).float()[:, None, :, :]
        if not conf_per_pixel:
            conf_mask = conf_mask.mean()
        loss_mask = loss_mask * conf_mask
    delta_prob = prob_cons_stu - prob_cons_tea
    consistency_loss = delta_prob * delta_prob
    consistency_loss = consistency_loss.sum(dim=1, keepdim=True)
    consistency_loss = (consistency_loss * loss_mask).mean()
    return consistency_loss


# --- DACS trainUDA.py lines 111-122 (update_ema_variables, single-GPU branch) ----------------------
def ref_update_ema_variables(ema_model, model, alpha_teacher, iteration):
    # Use the "true" average until the exponential average is more correct
    alpha_teacher = min(1 - 1 / (iteration + 1), alpha_teacher)
    for ema_param, param in zip(ema_model.parameters(), model.parameters()):
        #ema_param.data.mul_(alpha).add_(1 - alpha, param.data)
        ema_param.data[:] = alpha_teacher * ema_param[:].data[:] + (1 - alpha_teacher) * param[:].data[:]
    return ema_model


# --- French et al. optim_weight_ema.py lines 4-25 (EMAWeightOptimizer; key check dropped) ------------
class RefEMAWeightOptimizer:
    def __init__(self, target_net, source_net, ema_alpha):
        self.ema_alpha = ema_alpha
        self.target_params = [p for p in target_net.state_dict().values() if p.dtype == torch.float]
        self.source_params = [p for p in source_net.state_dict().values() if p.dtype == torch.float]
        for tgt_p, src_p in zip(self.target_params, self.source_params):
            tgt_p[...] = src_p[...]

    def step(self):
        one_minus_alpha = 1.0 - self.ema_alpha
        for tgt_p, src_p in zip(self.target_params, self.source_params):
            tgt_p.mul_(self.ema_alpha)
            tgt_p.add_(src_p * one_minus_alpha)


# =================================================================================================
# ClassMix and the mix
# =================================================================================================


def _labels(batch=4, h=12, w=13, num_classes=6, seed=0, ignore_share=0.1):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (batch, h, w), generator=g)
    # fewer classes in some images, and ignore pixels
    labels[1] = labels[1] % 3
    if batch > 2:
        labels[2] = 4  # a single class
    ignore = torch.rand((batch, h, w), generator=g) < ignore_share
    return torch.where(ignore, torch.full_like(labels, 255), labels)


@pytest.mark.parametrize("seed", range(5))
def test_class_mix_mask_matches_dacs(seed):
    num_classes = 6
    labels = _labels(seed=seed, num_classes=num_classes)
    mine = mixing.class_mix_mask(labels, _gen(seed), num_classes)

    keys = torch.rand((labels.shape[0], num_classes + 1), generator=_gen(seed))  # the same draws

    def choice_perm(image_i, nclasses):
        ids = torch.unique(torch.where(labels[image_i] == 255, num_classes, labels[image_i]))
        assert len(ids) == nclasses  # torch.unique's sorted order: the ignore value last, as 255
        return torch.argsort(keys[image_i, ids], stable=True).numpy()

    ref = torch.cat(ref_class_masks(labels, choice_perm))
    assert mine.dtype == torch.bool
    assert torch.equal(mine.long(), ref.long())


def test_class_mix_mask_covers_exactly_half_of_the_present_classes():
    num_classes = 6
    labels = _labels(batch=6, num_classes=num_classes, seed=3)
    mask = mixing.class_mix_mask(labels, _gen(), num_classes)
    for image, m in zip(labels, mask):
        present = torch.unique(image)
        chosen = torch.unique(image[m])
        assert len(chosen) == (len(present) + 1) // 2
        # every pixel of a chosen class is in the mask, no pixel of another
        assert torch.equal(m, torch.isin(image, chosen))


def test_class_mix_mask_one_class_takes_it_all():
    labels = torch.full((2, 5, 5), 3)
    assert mixing.class_mix_mask(labels, _gen(), 6).all()


def test_class_mix_draws_vary_and_replay():
    labels = _labels(batch=8, seed=1)
    a = mixing.class_mix_mask(labels, _gen(7), 6)
    b = mixing.class_mix_mask(labels, _gen(7), 6)
    c = mixing.class_mix_mask(labels, _gen(8), 6)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_mix_matches_dacs_one_mix_on_images_labels_and_weights():
    g = torch.Generator().manual_seed(5)
    labels = _labels(batch=2, seed=5)
    mask = mixing.class_mix_mask(labels, g, 6)
    source, target = torch.randn(2, 3, 12, 13, generator=g), torch.randn(2, 3, 12, 13, generator=g)
    pseudo = torch.randint(0, 6, (2, 12, 13), generator=g)
    mixed_img = mixing.mix(mask, source, target)
    mixed_lbl = mixing.mix(mask, labels, pseudo)
    for i in range(2):
        m = mask[i].long().unsqueeze(0)  # DACS's mask: generate_class_mask(...).unsqueeze(0), long
        ref_img, _ = ref_oneMix(m, data=torch.stack((source[i], target[i])))
        _, ref_lbl = ref_oneMix(m, target=torch.stack((labels[i], pseudo[i])))
        assert torch.equal(mixed_img[i:i + 1], ref_img)
        assert torch.equal(mixed_lbl[i:i + 1], ref_lbl.long())
    assert mixed_lbl.dtype == labels.dtype


# =================================================================================================
# CutMix
# =================================================================================================


def _replayed_box_draws(seed, batch, n_boxes, random_aspect_ratio, prop_by_area):
    g = _gen(seed)
    draw = lambda shape: torch.rand(shape, generator=g, dtype=torch.float64).numpy()  # noqa: E731
    shape = (batch, n_boxes)
    if prop_by_area:
        draws = [draw(shape)] + ([draw(shape)] if random_aspect_ratio else [])
    else:
        draws = [draw(shape), draw(shape)] if random_aspect_ratio else [draw(shape)]
    return draws + [draw(shape + (2,))]


@pytest.mark.parametrize("prop_range", [0.5, (0.0, 1.0), (0.25, 0.6)])
@pytest.mark.parametrize("n_boxes", [1, 3])
@pytest.mark.parametrize("random_aspect_ratio", [True, False])
@pytest.mark.parametrize("prop_by_area", [True, False])
@pytest.mark.parametrize("invert", [True, False])
def test_box_mask_matches_french_box_mask_generator(prop_range, n_boxes, random_aspect_ratio, prop_by_area, invert):
    if n_boxes > 1 and not random_aspect_ratio:
        pytest.skip("the reference scales aliased arrays twice here: test_box_mask_fixed_aspect_several_boxes")
    batch, shape, seed = 16, (21, 32), 11
    kwargs = dict(n_boxes=n_boxes, random_aspect_ratio=random_aspect_ratio, prop_by_area=prop_by_area,
                  within_bounds=True, invert=invert)
    mine = mixing.box_mask(batch, shape, _gen(seed), prop_range=prop_range, **kwargs)
    rng = ReplayRng(_replayed_box_draws(seed, batch, n_boxes, random_aspect_ratio, prop_by_area))
    ref = RefBoxMaskGenerator(prop_range, **kwargs).generate_params(batch, shape, rng=rng)
    assert not rng.draws
    assert mine.shape == (batch,) + shape
    assert np.array_equal(mine.numpy().astype(np.float64), ref[:, 0])


@pytest.mark.parametrize("prop_by_area", [True, False])
def test_box_mask_fixed_aspect_several_boxes(prop_by_area):
    # mask_gen.py 84-87 / 96-99: ``y_props = x_props = ...`` then ``y_props *= fac; x_props *= fac``
    # scales the one array twice, each side by 1/n instead of 1/sqrt(n). mixing.box_mask scales once.
    batch, shape, n = 200, (60, 60), 4
    kwargs = dict(n_boxes=n, random_aspect_ratio=False, prop_by_area=prop_by_area, within_bounds=True, invert=True)
    draws = _replayed_box_draws(0, batch, n, False, prop_by_area)
    ref = RefBoxMaskGenerator(0.36, **kwargs).generate_params(batch, shape, rng=ReplayRng(draws))
    mine = mixing.box_mask(batch, shape, _gen(0), prop_range=0.36, **kwargs)
    side = math.sqrt(0.36) if prop_by_area else 0.36
    # each box: side * sqrt(1/n) (mine), side / n (the reference) of each dimension
    ref_side = int(round(side / n * 60))
    assert ref.sum(axis=(1, 2, 3)).max() <= n * ref_side ** 2
    mine_side = int(round(side / math.sqrt(n) * 60))
    assert mine.flatten(1).sum(1).max() <= n * mine_side ** 2 and mine.flatten(1).sum(1).max() > n * ref_side ** 2


def test_box_mask_outside_bounds_matches_where_the_reference_does_not_wrap():
    batch, shape, seed = 64, (20, 24), 3
    mine = mixing.box_mask(batch, shape, _gen(seed), within_bounds=False)
    draws = _replayed_box_draws(seed, batch, 1, True, True)
    ref = RefBoxMaskGenerator(0.5, within_bounds=False, invert=True).generate_params(batch, shape, rng=ReplayRng(draws))
    # the reference's boxes whose start is not negative (numpy wraps a negative start around)
    props = 0.5 + 0.0 * draws[0]
    y = np.exp(draws[1] * np.log(props))
    sizes = np.round(np.stack([y, props / y], axis=2) * np.array(shape))
    starts = np.round(np.array(shape) * draws[2]) - sizes * 0.5
    fine = (starts.astype(int) >= 0).all(axis=(1, 2))  # int(): -0.5 -> 0 is fine
    assert fine.sum() > 5
    assert np.array_equal(mine.numpy()[fine].astype(np.float64), ref[fine, 0])
    # elsewhere the box is clipped to the image: at most the drawn area, never wrapped
    assert (mine.flatten(1).float().mean(1) <= 0.5 + 0.05).all()


def test_box_mask_area_within_the_references_range():
    batch, (h, w) = 500, (64, 96)
    mask = mixing.box_mask(batch, (h, w), _gen(), prop_range=0.5)
    area = mask.flatten(1).float().mean(1)
    # one box of half the image, sides rounded to whole pixels: within a pixel row and column of 0.5
    slack = 1.0 / h + 1.0 / w + 1.0 / (h * w)
    assert ((area - 0.5).abs() <= slack).all()
    # the box is one rectangle inside the image
    for m in mask[:50]:
        rows, cols = m.any(1).nonzero().flatten(), m.any(0).nonzero().flatten()
        assert m[rows.min():rows.max() + 1, cols.min():cols.max() + 1].all()
    # a range: areas spread over it
    area = mixing.box_mask(batch, (h, w), _gen(), prop_range=(0.25, 0.75)).flatten(1).float().mean(1)
    assert area.min() >= 0.25 - slack and area.max() <= 0.75 + slack and area.std() > 0.1


def test_box_mask_on_the_data_device_and_no_invert():
    m = mixing.box_mask(3, (8, 8), _gen(), device="cpu", invert=False)
    assert m.device.type == "cpu" and (~m).flatten(1).float().mean(1).sub(0.5).abs().max() < 0.3


# =================================================================================================
# Colour jitter and blur
# =================================================================================================

DACS_IMG_MEAN = torch.tensor((104.00698793, 116.66876762, 122.67891434), dtype=torch.float32)  # trainUDA.py 598


def _dacs_images(batch=2, h=24, w=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    raw = torch.rand(batch, 3, h, w, generator=g) * 255
    raw[:, :, :3, :3] = 128.0  # grey pixels: zero saturation
    raw[:, 0, -1, :] = 255.0  # saturated channel
    return raw - DACS_IMG_MEAN.view(1, 3, 1, 1)  # DACS's input: 0-255 minus its mean


def _dacs_draws(seed, batch, shared=True):
    g = _gen(seed)
    coin = torch.rand((1 if shared else batch,), generator=g)
    factors = torch.rand((batch, 4), generator=g)
    keys = torch.rand((batch, 4), generator=g)
    return coin, factors, keys


@pytest.mark.parametrize("seed", range(8))
def test_dacs_color_jitter_matches_dacs_and_kornia(seed):
    batch, s = 2, 0.25
    images = _dacs_images(batch=batch, seed=seed)
    mine = mixing.dacs_color_jitter(images, _gen(seed), mean=DACS_IMG_MEAN / 255, std=[1 / 255] * 3)
    coin, factors, keys = _dacs_draws(seed, batch)
    for i in range(batch):
        # kornia's ranges for ColorJitter(s, s, s, s) (augmentation.py 234-247): [1-s, 1+s] x 3, [-s, s]
        params = dict(brightness_factor=(1 - s) + 2 * s * factors[i, 0:1],
                      contrast_factor=(1 - s) + 2 * s * factors[i, 1:2],
                      saturation_factor=(1 - s) + 2 * s * factors[i, 2:3],
                      hue_factor=-s + 2 * s * factors[i, 3:4],
                      order=torch.argsort(keys[i], stable=True))
        # DACS calls colorJitter on each mixed image alone (a batch of one), with one coin for both
        ref, _ = ref_colorJitter(float(coin[0]), DACS_IMG_MEAN, data=images[i:i + 1], s=s, params=params)
        torch.testing.assert_close(mine[i:i + 1], ref, atol=2e-3, rtol=0)  # 0-255 scale: 1e-5 of the range
    if float(coin[0]) <= 0.2:
        assert torch.equal(mine, images)


def test_dacs_color_jitter_applies_four_times_in_five():
    images = _dacs_images(batch=1, h=4, w=4)
    g = _gen(0)
    applied = [not torch.equal(mixing.dacs_color_jitter(images, g, mean=DACS_IMG_MEAN / 255, std=[1 / 255] * 3), images)
               for _ in range(400)]
    assert 0.72 < np.mean(applied) < 0.88


def test_dacs_color_jitter_per_image_coins():
    images = _dacs_images(batch=64, h=4, w=4)
    out = mixing.dacs_color_jitter(images, _gen(2), mean=DACS_IMG_MEAN / 255, std=[1 / 255] * 3, shared_coin=False)
    same = [torch.equal(a, b) for a, b in zip(out, images)]
    assert 0 < sum(same) < 64


@pytest.mark.parametrize("length,size", [(512, 51), (1024, 103), (30, 3), (20, 1), (25, 3), (321, 33)])
def test_dacs_blur_kernel_size(length, size):
    assert mixing.dacs_blur_kernel_size(length) == size
    k = int(np.floor(np.ceil(0.1 * length) - 0.5 + np.ceil(0.1 * length) % 2))  # transformsgpu.py 25
    assert k == size


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("shape", [(40, 56), (33, 21)])
def test_dacs_gaussian_blur_matches_dacs_and_kornia(seed, shape):
    batch = 2
    images = _dacs_images(batch=batch, h=shape[0], w=shape[1], seed=seed)
    mine = mixing.dacs_gaussian_blur(images, _gen(seed))
    g = _gen(seed)
    coin = torch.rand((1,), generator=g)
    sigmas = 0.15 + (1.15 - 0.15) * torch.rand((batch,), generator=g)
    for i in range(batch):
        ref, _ = ref_gaussian_blur(float(coin[0]), data=images[i:i + 1], sigma=float(sigmas[i]))
        torch.testing.assert_close(mine[i:i + 1], ref, atol=2e-3, rtol=0)
    if float(coin[0]) <= 0.5:
        assert torch.equal(mine, images)


def test_dacs_gaussian_blur_keeps_a_constant_image():
    images = torch.full((3, 3, 30, 40), 0.7)
    out = mixing.dacs_gaussian_blur(images, _gen(), skip_prob=-1.0)
    torch.testing.assert_close(out, images)


def _torchvision_jitter(unit, factors, order, jitter, grey, p=0.8, grayscale_p=0.2):
    """torchvision's ColorJitter(0.4, 0.4, 0.4, 0.1) in RandomApply(p) then RandomGrayscale(p), its
    forward (transforms.py ColorJitter.forward) with get_params' draws replaced by ours."""
    import torchvision.transforms.functional as TF

    b = 0.6 + 0.8 * float(factors[0])
    c = 0.6 + 0.8 * float(factors[1])
    s = 0.6 + 0.8 * float(factors[2])
    h = -0.1 + 0.2 * float(factors[3])
    img = unit
    if float(jitter) < p:  # RandomApply: ``if self.p < torch.rand(1): return img``
        for fn_id in order.tolist():
            if fn_id == 0:
                img = TF.adjust_brightness(img, b)
            elif fn_id == 1:
                img = TF.adjust_contrast(img, c)
            elif fn_id == 2:
                img = TF.adjust_saturation(img, s)
            elif fn_id == 3:
                img = TF.adjust_hue(img, h)
    if float(grey) < grayscale_p:
        img = TF.rgb_to_grayscale(img, num_output_channels=3)
    return img


@pytest.mark.parametrize("seed", range(6))
def test_french_color_jitter_matches_torchvision(seed):
    batch = 16
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    unit = torch.rand(batch, 3, 10, 12, generator=_gen(seed + 100))
    unit[:, :, :2, :2] = 0.5
    images = (unit - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    mine = mixing.french_color_jitter(images, _gen(seed), mean=mean, std=std)
    g = _gen(seed)
    jitter = torch.rand((batch,), generator=g)
    factors = torch.rand((batch, 4), generator=g)
    keys = torch.rand((batch, 4), generator=g)
    grey = torch.rand((batch,), generator=g)
    for i in range(batch):
        ref = _torchvision_jitter(unit[i:i + 1], factors[i], torch.argsort(keys[i], stable=True), jitter[i], grey[i])
        torch.testing.assert_close(mine[i:i + 1] * std.view(1, 3, 1, 1) + mean.view(1, 3, 1, 1), ref, atol=1e-5, rtol=0)
        if float(jitter[i]) >= 0.8 and float(grey[i]) >= 0.2:
            assert torch.equal(mine[i], images[i])


# =================================================================================================
# Confidence weights and losses
# =================================================================================================


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # the reference's np.array(t.cpu())
@pytest.mark.parametrize("seed", range(4))
def test_dacs_weights_match_dacs(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 5, 9, 11, generator=g) * 6  # a spread of confidences around 0.968
    labels = _labels(batch=2, h=9, w=11, num_classes=5, seed=seed)
    mask = mixing.class_mix_mask(labels, g, 5)

    confidence, pseudo = mixing.teacher_confidence(logits)
    weight = mixing.dacs_mixed_pixel_weight(mask, mixing.dacs_pseudo_weight(confidence))

    masks = [mask[i].long().unsqueeze(0) for i in range(2)]
    ref_conf, ref_pseudo, ref_weight = ref_dacs_weights(logits, pseudo, *masks)
    assert torch.equal(confidence, ref_conf) and torch.equal(pseudo, ref_pseudo)
    assert torch.equal(weight, ref_weight)
    share = float((ref_conf >= 0.968).float().mean())
    assert 0.0 < share < 1.0


def test_dacs_pseudo_weight_per_batch_and_per_image():
    confidence = torch.zeros(2, 4, 5)
    confidence[0, :2] = 0.99  # 10 of 20 pixels confident in image 0, none in image 1
    confidence[0, 2, 0] = 0.968  # the threshold counts (ge)
    batch = mixing.dacs_pseudo_weight(confidence)
    assert batch.shape == confidence.shape and torch.equal(batch, torch.full_like(confidence, 11 / 40))
    per_image = mixing.dacs_pseudo_weight(confidence, per_image=True)
    assert torch.equal(per_image[0], torch.full((4, 5), 11 / 20)) and torch.equal(per_image[1], torch.zeros(4, 5))


def test_pixel_weighted_cross_entropy_matches_dacs():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, 8, generator=g)
    labels = _labels(batch=2, h=7, w=8, num_classes=5, ignore_share=0.3)
    weight = torch.rand(2, 7, 8, generator=g)
    ref = RefCrossEntropyLoss2dPixelWiseWeighted(ignore_index=255)(logits, labels, weight)
    assert torch.equal(mixing.pixel_weighted_cross_entropy(logits, labels, weight), ref)


@pytest.mark.parametrize("per_pixel", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_french_confidence_and_consistency_match_french(per_pixel, seed):
    g = torch.Generator().manual_seed(seed)
    tea0, tea1 = torch.randn(2, 2, 4, 6, 7, generator=g) * 8
    stu = torch.randn(2, 4, 6, 7, generator=g)
    valid = (torch.rand(2, 1, 6, 7, generator=g) > 0.1).float()
    box = mixing.box_mask(2, (6, 7), g)
    # the reference's mix (lines 350-363): x0 * (1 - m) + x1 * m, m (N, 1, H, W) float
    m = box.float()[:, None]
    ref_tea = tea0 * (1 - m) + tea1 * m
    ref_valid = valid * (1 - m) + valid * m
    tea = mixing.mix(box, tea1, tea0)
    assert torch.equal(tea, ref_tea)
    conf = mixing.french_confidence_mask(torch.softmax(tea, dim=1), per_pixel=per_pixel)
    mine = mixing.french_consistency_loss(stu, tea, mixing.mix(box, valid, valid), conf)
    ref = ref_french_consistency(stu, ref_tea, ref_valid, conf_per_pixel=per_pixel)
    assert torch.equal(mine, ref)
    assert conf.dim() == (4 if per_pixel else 0)


# =================================================================================================
# EMA
# =================================================================================================


def _net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1)).double()


def _perturb(net, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype))


def test_ema_decay_is_dacs_warmup():
    assert mixing.ema_decay(0) == 0.0
    assert mixing.ema_decay(1) == 0.5
    assert mixing.ema_decay(98) == 1 - 1 / 99
    assert mixing.ema_decay(99) == 0.99 and mixing.ema_decay(10_000) == 0.99
    assert mixing.ema_decay(0, warmup=False) == 0.99


def test_ema_update_matches_dacs_in_float64():
    student, teacher, ref_teacher = _net(0), _net(1), _net(1)
    for step in range(0, 130, 7):
        _perturb(student, step)
        mixing.ema_update_(list(teacher.parameters()), list(student.parameters()), mixing.ema_decay(step, 0.99))
        ref_update_ema_variables(ref_teacher, student, 0.99, step)
        for a, b in zip(teacher.parameters(), ref_teacher.parameters()):
            assert a.dtype == torch.float64 and torch.equal(a, b)
    # DACS averages parameters only: BatchNorm's running statistics are left alone
    assert torch.equal(teacher[1].running_mean, torch.zeros(4, dtype=torch.float64))


def test_ema_update_matches_french_on_float_state():
    student, teacher, ref_teacher = _net(0).float(), _net(1).float(), _net(1).float()
    ref = RefEMAWeightOptimizer(ref_teacher, student, 0.99)
    floats = lambda net: [t for t in net.state_dict().values() if t.dtype == torch.float]  # noqa: E731
    for t, s in zip(floats(teacher), floats(student)):
        t.copy_(s)
    with torch.no_grad():
        student[1].running_mean.add_(1.0)
    for step in range(5):
        _perturb(student, step)
        mixing.ema_update_(floats(teacher), floats(student), mixing.ema_decay(step, warmup=False))
        ref.step()
    for a, b in zip(teacher.state_dict().values(), ref_teacher.state_dict().values()):
        assert torch.equal(a, b)


def test_ema_update_refuses_integer_buffers_and_mismatches():
    teacher, student = _net(0), _net(1)
    with pytest.raises(TypeError, match="non-floating"):
        mixing.ema_update_(teacher.state_dict().values(), student.state_dict().values(), 0.9)
    with pytest.raises(ValueError, match="tensors"):
        mixing.ema_update_(list(teacher.parameters())[:2], list(student.parameters()), 0.9)


def test_ema_update_across_dtypes_casts_the_student():
    teacher = [torch.zeros(3, dtype=torch.float32)]
    student = [torch.ones(3, dtype=torch.float64)]
    mixing.ema_update_(teacher, student, 0.75)
    assert torch.equal(teacher[0], torch.full((3,), 0.25))


# =================================================================================================
# No host sync
# =================================================================================================


@pytest.fixture
def no_host_sync(monkeypatch):
    """Any read of a tensor's value back to Python fails."""
    def refuse(name):
        def method(self, *args, **kwargs):
            raise AssertionError(f"host sync: Tensor.{name}")
        return method

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse(name))


def _run_hot_path(device, generator):
    labels = _labels(batch=2, h=16, w=20, num_classes=6).to(device)
    source = torch.randn(2, 3, 16, 20, device=device)
    target = torch.randn(2, 3, 16, 20, device=device)
    mask = mixing.class_mix_mask(labels, generator, 6)
    box = mixing.box_mask(2, (16, 20), generator, device=device)
    mixed = mixing.mix(mask, source, target)
    mixed = mixing.dacs_color_jitter(mixed, generator, mean=[0.4] * 3, std=[0.2] * 3, skip_prob=-1.0)
    mixed = mixing.dacs_gaussian_blur(mixed, generator, skip_prob=-1.0)
    mixed = mixing.french_color_jitter(mixed, generator, mean=[0.4] * 3, std=[0.2] * 3)
    logits = torch.randn(2, 6, 16, 20, device=device)
    confidence, pseudo = mixing.teacher_confidence(logits)
    weight = mixing.dacs_mixed_pixel_weight(mask, mixing.dacs_pseudo_weight(confidence))
    loss = mixing.pixel_weighted_cross_entropy(logits, mixing.mix(mask, labels, pseudo), weight)
    conf = mixing.french_confidence_mask(torch.softmax(logits, 1))
    loss = loss + mixing.french_consistency_loss(logits, logits, box.float()[:, None], conf)
    return mixed, loss


def test_no_host_sync_on_the_hot_path(no_host_sync):
    mixed, loss = _run_hot_path("cpu", _gen())
    assert mixed.shape == (2, 3, 16, 20) and loss.dim() == 0


def test_ema_update_no_host_sync(no_host_sync):
    teacher, student = _net(0), _net(1)
    mixing.ema_update_(list(teacher.parameters()), list(student.parameters()), mixing.ema_decay(3))


@pytest.mark.cuda
@pytest.mark.parametrize("generator_device", ["cpu", "cuda"])
def test_no_host_sync_on_cuda(generator_device):
    generator = torch.Generator(device=generator_device).manual_seed(0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        mixed, loss = _run_hot_path("cuda", generator)
        teacher = [torch.zeros(5, 7, device="cuda") for _ in range(3)]
        student = [torch.ones(5, 7, device="cuda") for _ in range(3)]
        mixing.ema_update_(teacher, student, 0.99)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert mixed.device.type == "cuda" and torch.isfinite(loss)
    assert torch.allclose(teacher[0], torch.full((5, 7), 0.01, device="cuda"))


@pytest.mark.cuda
def test_cuda_matches_cpu_with_a_cpu_generator():
    cpu_mixed, cpu_loss = _run_hot_path("cpu", _gen(4))
    cuda_mixed, cuda_loss = _run_hot_path("cuda", _gen(4))
    torch.testing.assert_close(cuda_mixed.cpu(), cpu_mixed, atol=1e-4, rtol=1e-4)


@pytest.mark.cuda
def test_ema_update_teacher_on_cuda_student_on_cpu_and_back():
    student = _net(0)
    teacher_cuda = _net(1).cuda()
    ref = _net(1)
    mixing.ema_update_(list(teacher_cuda.parameters()), list(student.parameters()), 0.9)
    ref_update_ema_variables(ref, student, 0.9, 1000)
    for a, b in zip(teacher_cuda.parameters(), ref.parameters()):
        torch.testing.assert_close(a.cpu(), b, atol=1e-12, rtol=0)


@pytest.mark.cuda2
def test_ema_update_across_two_cuda_devices_without_sync():
    student = [torch.randn(64, 64, device="cuda:0", dtype=torch.float64) for _ in range(4)]
    teacher = [torch.randn(64, 64, device="cuda:1", dtype=torch.float64) for _ in range(4)]
    expected = [0.99 * t.cpu() + (1 - 0.99) * s.cpu() for t, s in zip(teacher, student)]
    torch.cuda.synchronize("cuda:0")
    torch.cuda.synchronize("cuda:1")
    torch.cuda.set_sync_debug_mode("error")
    try:
        mixing.ema_update_(teacher, student, 0.99)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for t, e in zip(teacher, expected):
        assert torch.equal(t.cpu(), e)


def test_a_hue_a_hair_below_zero_is_hue_zero_not_a_seventh_sector():
    """float32's remainder(-6e-9, 6) is exactly 6.0: the jitter's hue shift found it in a real run
    (issue 47's grid: "index 6 is out of bounds for dimension 2 with size 6")."""
    from segadv.methods.mixing import _hsv_to_rgb

    s, v = torch.full((1, 1, 2, 2), 0.5), torch.full((1, 1, 2, 2), 0.8)
    hue = torch.full((1, 1, 2, 2), -1e-9)
    assert torch.remainder(hue * 6.0, 6.0).max().item() == 6.0  # the case exists
    assert torch.equal(_hsv_to_rgb(hue, s, v), _hsv_to_rgb(torch.zeros_like(hue), s, v))
