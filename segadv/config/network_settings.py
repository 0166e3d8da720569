"""One network's settings, the values of the per-network sections' entries
(segadv/config/network_sections.py): a discriminator's model, an optimizer, an autocast, a wrapper,
the weights to start from. G's model section is the arch table's (segadv/models/registry.py)."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, model_validator

from segadv.config.section import Beta, Section


class DiscriminatorConfig(Section):
    kind: Literal["fc", "image"] = Field(
        "fc",
        description="fc: AdvSemiSeg's fully convolutional D (a logit per pixel of a class map); image: "
        "s4GAN's image-level D (one logit per image)")
    ndf: int = Field(64, gt=0, le=256, description="width of D's first convolution (later ones double it, up to 8x)")
    # fc: the last one is D's classifier and its logit map is the training size halved this many
    # times; 5 is the reference's (10x10 at 321 px, but 2x2 at 80 px: use 3 there).
    num_downsamples: Optional[int] = Field(
        None, ge=1, le=10,
        description="D's stride-2 convolutions (fc: its logit map is the training size halved this many "
        "times, checked against the smallest training image); null: the kind's reference (fc 5, image 4)")
    align_corners: bool = Field(
        True,
        description="fc: upsample D's logit map with align_corners (AdvSemiSeg's reference; "
        "docs/methods.md \"Deviations\")")


class OptimizerConfig(Section):
    name: Literal["sgd", "adam", "adamw"] = Field(description="the optimizer: sgd, adam or adamw (torch.optim)")
    # Above 100 no optimizer converges, and near float32's limit the update itself overflows.
    lr: float = Field(gt=0, le=100, description="base learning rate (> 0, at most 100), decayed by the poly schedule")
    momentum: float = Field(0.9, ge=0, lt=1, description="sgd: momentum in [0, 1)")
    weight_decay: float = Field(0.0, ge=0, le=1, description="L2 penalty (adamw: decoupled decay), 0..1")
    betas: list[Beta] = Field(
        [0.9, 0.999], min_length=2, max_length=2, description="adam / adamw: the two moment decays, each in [0, 1)")
    poly_power: float = Field(
        0.9, ge=0, le=100,
        description="poly schedule: lr = base_lr * (1 - max(step - poly_lag, 0) / poly_horizon) ** poly_power "
                    "(0: constant)")
    # The references decay over 250,000 iterations and stop earlier (AdaptSegNet 150,000, ADVENT 120,000).
    poly_horizon: Optional[int] = Field(
        None, ge=1, le=10**9,
        description="steps the poly schedule decays over (at least train.max_steps); null: train.max_steps")
    # When the reference sets the lr: before optimizer.step() from the iteration about to run (0:
    # AdvSemiSeg, AdaptSegNet, ADVENT, s4GAN, DACS) or after it from the iteration just run (1:
    # UniMatch, UniMatch V2), so that their iteration k trains at k - 1's value (docs/methods.md).
    poly_lag: int = Field(
        0, ge=0, le=1,
        description="steps the poly decay runs behind the iteration: iteration k (from 0) trains at "
                    "lr * (1 - max(k - poly_lag, 0) / poly_horizon) ** poly_power. 0: the lr set before each "
                    "step (AdvSemiSeg, AdaptSegNet, ADVENT, mmseg); 1: set after each step from the one just "
                    "run (UniMatch): iteration 0 at lr, k at k - 1's value. The warm-up counts k unshifted")
    # The references train their classifier at 10x the backbone's rate (optim_parameters).
    head_lr_mult: float = Field(
        1.0, gt=0, le=1000,
        description="generator: the learning rate of everything but the encoder (the head: classifier, decoder, "
                    "aux head) as a multiple of lr; the references' DeepLab-v2: 10")
    head_weight_decay: Optional[float] = Field(
        None, ge=0, le=1, description="generator: the head's weight decay; null: weight_decay (the references')")
    # BEiT's and DINOv2's fine-tuning rule: the deeper a layer, the closer to lr it trains.
    layer_decay: float = Field(
        1.0, gt=0, le=1,
        description="generator: layer-wise lr decay where G's arch numbers its encoder's layers (dinov2, dinov3): "
                    "layer k of L trains at lr * layer_decay ** (L - k) (the embedding the lowest, the last block at lr); "
                    "1.0: every encoder layer at lr")
    warmup_steps: int = Field(
        0, ge=0, le=10**9,
        description="linear warm-up: the lr rises from lr / warmup_steps to the poly schedule's value over the first "
                    "warmup_steps steps (0: none)")
    implementation: Literal["auto", "for_loop", "foreach", "fused"] = Field(
        "auto",
        description="torch's update kernels: auto (foreach on CUDA, a loop on the CPU), for_loop, foreach "
        "(one multi-tensor op a group) or fused")

    @property
    def sets_head_apart(self) -> bool:
        """Whether the head trains at other settings than the backbone."""
        return self.head_lr_mult != 1.0 or self.head_weight_decay is not None or self.layer_decay != 1.0


class NetworkAmpConfig(Section):
    # auto is resolved once per network on its own devices when the run's roles are built
    # (segadv/training/build.py, rule in segadv/engine/amp_optimizer.py resolve_auto); a stored
    # config keeps auto, so a resume on another machine resolves again.
    enabled: Union[bool, Literal["auto"]] = Field(
        False, description="run this network's forward under autocast: true, false, or auto (bfloat16 where "
                           "its device computes bf16 natively: CUDA compute capability 8.0+, a CPU with "
                           "AMX-BF16 or AVX512-BF16; else off)")
    dtype: Literal["float16", "bfloat16"] = Field("bfloat16", description="autocast dtype: bfloat16, or float16 (with a GradScaler); enabled: auto is bfloat16 only")
    # Up to 2**32: far above any useful scale, and a float32 scale that can still halve.
    init_scale: float = Field(2.0**16, gt=0, le=2.0**32, description="float16 only: the GradScaler's starting loss scale")
    # FSDP's MixedPrecisionPolicy (torchtitan's mixed_precision_param / mixed_precision_reduce,
    # Lightning's FSDP mixed precision): a precision setting, so beside enabled and dtype, per
    # network as they are (a teacher without an amp entry takes its student's, as it takes its
    # student's sharding). Checked at start against parallel.<role> (segadv/training/checks.py).
    fsdp_param_dtype: Literal["float32", "amp"] = Field(
        "float32", description="parallel.<network>: fsdp only: the dtype FSDP all-gathers this network's "
                               "parameters in: float32 (their own), or amp (this entry's dtype: half the all-gather, "
                               "and every op, those autocast keeps in float32 included, sees the rounded weights); "
                               "gradients are reduce-scattered in float32, and the sharded parameters and optimizer "
                               "state stay float32, either way. amp needs enabled: true, or auto resolving to bf16")

    @model_validator(mode="after")
    def _auto_is_bfloat16(self) -> "NetworkAmpConfig":
        # fp16 is never chosen by a machine check: it needs loss scaling and overflows where bf16
        # does not, and on a CPU it is 46x slower than float32 (docs/performance.md). Refused
        # rather than silently ignored, so a config says what it runs.
        if self.enabled == "auto" and self.dtype == "float16":
            raise ValueError("enabled: auto chooses bfloat16 or off, never float16; write enabled: true with "
                             "dtype: float16, or leave dtype out (bfloat16) with auto")
        if self.fsdp_param_dtype == "amp" and self.enabled is False:
            raise ValueError("fsdp_param_dtype: amp gathers the parameters in this network's autocast dtype, but "
                             "enabled is false (no autocast): set enabled: true, or fsdp_param_dtype: float32")
        return self

    @property
    def is_auto(self) -> bool:
        return self.enabled == "auto"


ParallelMode = Literal["auto", "none", "dp", "ddp", "fsdp"]


class InitSource(Section):
    path: str = Field(min_length=1, description="weights file to start from (any format the checkpoint loader takes)")
    # e.g. ["segmentation_head.*"] to start from weights trained with another number of classes.
    exclude: list[Annotated[str, Field(min_length=1)]] = Field(
        [], description="glob patterns of model keys not taken from the file (they keep their fresh init)")
