"""Mean teacher (issue 47): self-training with an EMA teacher of G and mixed images, DACS's
(Tranheden et al., WACV 2021) in adaptation and French et al.'s (BMVC 2020) regime in
semi-supervised runs, with AdvSemiSeg's or AdaptSegNet's adversarial term on top as one key
(``loss.lambda_adv``, every method's adversarial weight; null here: 0, no D). What the method
declares before any network exists (its settings, streams, networks, losses, checks) and what its
iteration reads from the config (``MeanTeacherSetup``), torch-free so the config loads without
torch; its iteration is ``iteration.py`` beside this file.

One method for both settings: without ``target_data`` it reads a labeled and an unlabeled stream
(AdvSemiSeg's), with it a source and a target stream (AdaptSegNet's). Every default is a
reference's, with its source lines in docs/methods.md ("Mean teacher").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional

from pydantic import Field

from segadv.config.schema import Probability, Section, Weight
from segadv.data.stream_spec import StreamSpec
from segadv.errors import UserError
from segadv.methods.base import Method, Setup

if TYPE_CHECKING:
    from segadv.config import Config


class MeanTeacherConfig(Section):
    """The mean teacher's settings; defaults are DACS's (vikolss/DACS configUDA.json, trainUDA.py)."""

    mix: Literal["classmix", "cutmix"] = Field(
        "classmix", description="the mask: classmix (DACS: half the classes of the labeled/source label map) or "
                                "cutmix (French et al.: one random box of half the area)")
    ema_decay: Probability = Field(0.99, description="the teacher's EMA decay after each G step (DACS, French et al.: 0.99)")
    ema_warmup: bool = Field(
        True, description="DACS's warm-up: decay min(1 - 1/(step+1), ema_decay); false: ema_decay from the first step "
                          "(French et al.)")
    teacher_batchnorm: Literal["batch", "running"] = Field(
        "batch", description="the teacher's BatchNorm: batch (train mode, batch statistics of the unlabeled/target "
                             "batch; the EMA averages the parameters only, as DACS) or running (eval mode; the EMA "
                             "averages the running statistics too, as French et al.'s)")
    confidence: Literal["dacs", "french"] = Field(
        "dacs", description="the pseudo labels' weight: dacs (share of pixels whose top probability reaches "
                            "dacs_threshold; 1 on the pasted labeled pixels) or french (confident-pixel mask at "
                            "french_threshold)")
    dacs_threshold: Probability = Field(0.968, description="DACS's confidence threshold (configUDA.json)")
    french_threshold: Probability = Field(0.97, description="French et al.'s confidence threshold (conf_thresh)")
    confidence_share: Literal["batch", "image", "pixel"] = Field(
        "batch", description="over what the confident share is counted: batch (both references' published runs), "
                             "image (one weight per image) or pixel (each pixel its own 0/1)")
    lambda_unsup: Weight = Field(1.0, description="weight of the student's loss on the mixed images (consistency_weight)")
    color_jitter: bool = Field(True, description="DACS's colour jitter on the mixed images (80 %, strength 0.25)")
    blur: bool = Field(True, description="DACS's Gaussian blur on the mixed images (50 %, sigma 0.15-1.15)")
    unlabeled_batch_size: Optional[int] = Field(
        None, gt=0, le=10**6, description="semi-supervised: batch of the unlabeled stream; null: data.batch_size")
    target_batch_size: Optional[int] = Field(
        None, gt=0, le=10**6, description="adaptation: batch of the target stream; null: data.batch_size")


# The streams, as AdvSemiSeg's (semi-supervised) and AdaptSegNet's (adaptation) declare them: the
# same names, pools and seed words, so a mean-teacher run draws the batches those methods draw.
SEMI_STREAMS = (
    StreamSpec("labeled", "labeled"),
    StreamSpec("unlabeled", "unlabeled", seed_word=1, batch_size_key="method.mean_teacher.unlabeled_batch_size"),
)
GT_STREAM = StreamSpec("gt", "labeled", seed_word=2)  # D's real maps (AdvSemiSeg's), with loss.lambda_adv > 0 only
ADAPTATION_STREAMS = (
    StreamSpec("source", "labeled"),
    StreamSpec("target", "target", seed_word=3, batch_size_key="method.mean_teacher.target_batch_size"),
)


@dataclass(frozen=True)
class MeanTeacherSetup(Setup):
    """``Setup`` (its ``lambda_adv``: D on top where > 0) and what the mixing and the teacher read."""

    settings: MeanTeacherConfig  # method.mean_teacher
    adapts: bool  # source/target streams (target_data given), else labeled/unlabeled
    mean: tuple[float, ...]  # data.input_normalization: the strong augmentation works on the images' pixels
    std: tuple[float, ...]
    seed: int  # train.seed: the mixing RNG's seed (with the rank)
    aux_head: bool  # model.generator.aux_head: G's aux output, carried at weight 0


class MeanTeacherSpec(Method):
    """The student G trained on a labeled/source batch and on mixed images labelled by its EMA
    teacher; D on top where ``loss.lambda_adv`` > 0."""

    name = "mean_teacher"
    iteration_path = "segadv.methods.mean_teacher.iteration:MeanTeacher"
    config = MeanTeacherConfig
    # D on top: the weight of AdvSemiSeg's (semi-supervised) or AdaptSegNet's (adaptation) adversarial
    # term on the student's unmixed unlabeled/target maps. DACS and French et al. have none: 0, and
    # with 0 no D is built.
    lambda_adv_default = 0.0
    streams = SEMI_STREAMS + (GT_STREAM,) + ADAPTATION_STREAMS  # every stream it may draw; data_streams: which
    losses = ("loss_seg", "loss_unsup", "pseudo_confidence", "loss_adv", "loss_d")
    d_losses = ("loss_d",)
    # the labeled/source batch's labelled pixels; the mixed image's labelled pixels of non-zero
    # weight; D's (semi-supervised): the gt batch's and G's labeled maps'
    selection_losses = ("loss_seg", "loss_unsup", "loss_d")
    # G's aux head (configs/uda.yaml's) is accepted and carried at weight 0: the teacher and the
    # losses read the main output, as the references' one-output DeepLab-v2.
    trains_aux_output = True
    diagnostics = ("train/loss_seg", "train/loss_unsup", "train/pseudo_confidence", "train/loss_d")

    @classmethod
    def adapts(cls, cfg: Config) -> bool:
        """Adaptation (source, target) where the config has a target domain, else semi-supervised."""
        return cfg.target_data is not None

    @classmethod
    def data_streams(cls, cfg: Config) -> tuple[StreamSpec, ...]:
        if cls.adapts(cfg):
            return ADAPTATION_STREAMS
        return SEMI_STREAMS + ((GT_STREAM,) if cls.adversarial_weight(cfg) > 0 else ())

    @classmethod
    def networks(cls, cfg: Config) -> tuple[str, ...]:
        # G (the student), its EMA teacher, and D only where its term is on: with 0 no D is built.
        return ("generator", "teacher") + (("discriminator",) if cls.adversarial_weight(cfg) > 0 else ())

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        return cls.adversarial_weight(cfg) > 0

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        super().check_config(cfg)
        if cls.adapts(cfg) and cls.settings(cfg).unlabeled_batch_size is not None:
            raise UserError("method.mean_teacher.unlabeled_batch_size: this run adapts to target_data, whose batch "
                            "is method.mean_teacher.target_batch_size")
        if not cls.adapts(cfg) and cls.settings(cfg).target_batch_size is not None:
            raise UserError("method.mean_teacher.target_batch_size: this run has no target_data (semi-supervised); "
                            "the unlabeled batch is method.mean_teacher.unlabeled_batch_size")
        cls.check_batches_match(cfg)

    @classmethod
    def check_batches_match(cls, cfg: Config) -> None:
        """Each labeled/source image is mixed with one unlabeled/target image (``mixing.mix``), so
        the two streams' batches must be equal: a mismatch is refused here, at the start, naming both
        keys, not at the first step once the run dir is written."""
        labeled, unlabeled = ADAPTATION_STREAMS if cls.adapts(cfg) else SEMI_STREAMS
        sizes = cls.stream_batch_sizes(cfg)
        if sizes[labeled.name] != sizes[unlabeled.name]:
            raise UserError(
                f"{unlabeled.batch_size_key}={sizes[unlabeled.name]} differs from {labeled.batch_size_key}="
                f"{sizes[labeled.name]}: the mean teacher mixes each {labeled.name} image with one {unlabeled.name} "
                f"image, so the two batches must be equal; set {unlabeled.batch_size_key} to "
                f"{sizes[labeled.name]} or null (null: {labeled.batch_size_key})")

    @classmethod
    def setup(cls, cfg: Config) -> MeanTeacherSetup:
        norm = cfg.data.input_normalization
        return MeanTeacherSetup(**vars(super().setup(cfg)), settings=cls.settings(cfg), adapts=cls.adapts(cfg),
                                mean=norm.mean, std=norm.std, seed=cfg.train.seed,
                                aux_head=cfg.model.generator.aux_head)
