"""UniMatch (Yang et al., CVPR 2023; LiheYoung/UniMatch ``unimatch.py``) and UniMatch V2 (Yang et
al., 2024; LiheYoung/UniMatch-V2 ``unimatch_v2.py``), semi-supervised: weak-to-strong
consistency on two strong views of each unlabeled image, with a feature-perturbation stream (V1)
or complementary channel dropout across the two views and an EMA teacher (V2); AdvSemiSeg's
adversarial term on top as one key (``loss.lambda_adv``; null here: 0, no D). One method,
``method.unimatch.variant`` choosing the reference: ``UniMatchSpec`` is what the registry and the
config know, and each reference's declaration (``UniMatchV1Spec``, ``UniMatchV2Spec``) adds its own
streams and networks and names its own iteration (``iteration.py``). What it declares before any
network exists and what its iteration reads (``UniMatchSetup``), torch-free. Every default is a
reference's, with its source lines in docs/methods.md ("UniMatch").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Mapping, Optional

from pydantic import Field

from segadv.config.schema import Probability, Section
from segadv.data.stream_spec import StreamSpec
from segadv.errors import UserError
from segadv.methods.base import Method, Setup

if TYPE_CHECKING:
    from segadv.config import Config
    from segadv.engine.network import Network
    from segadv.monitor.profile import PhaseTimer


class UniMatchConfig(Section):
    """UniMatch's settings; defaults are the references' (configs/pascal.yaml of both repositories)."""

    variant: Literal["v1", "v2"] = Field(
        "v2", description="v1: UniMatch (the weak view's pseudo labels from G itself, a second unlabeled batch "
                          "pasted by CutMix, Dropout2d(0.5) on a copy of the features); v2: UniMatch V2 (an EMA "
                          "teacher's pseudo labels, the batch's own images pasted, complementary channel dropout "
                          "across the two strong views)")
    confidence: Probability = Field(0.95, description="the pseudo labels' confidence threshold (conf_thresh)")
    ema_decay: Probability = Field(
        0.996, description="v2: the teacher's EMA decay after each G step, min(1 - 1/(step+1), ema_decay), parameters "
                           "and buffers (unimatch_v2.py: 0.996)")
    unlabeled_batch_size: Optional[int] = Field(
        None, gt=0, le=10**6, description="batch of the unlabeled stream (and of v1's second one); null: "
                                          "data.batch_size (both references: batch_size for each)")


STREAMS = (
    StreamSpec("labeled", "labeled"),
    StreamSpec("unlabeled", "unlabeled", seed_word=1, batch_size_key="method.unimatch.unlabeled_batch_size"),
)
# v1's second unlabeled batch, whose strong views are pasted into the first's (its own loader
# over the same pool, as unimatch.py's second trainloader_u); a seed word of its own.
MIX_STREAM = StreamSpec("unlabeled_mix", "unlabeled", seed_word=5,
                        batch_size_key="method.unimatch.unlabeled_batch_size")
GT_STREAM = StreamSpec("gt", "labeled", seed_word=2)  # D's real maps (AdvSemiSeg's), with loss.lambda_adv > 0 only


@dataclass(frozen=True)
class UniMatchSetup(Setup):
    """``Setup`` (its ``lambda_adv``: D on top where > 0) and what the views and the teacher read."""

    settings: UniMatchConfig  # method.unimatch
    mean: tuple[float, ...]  # data.input_normalization: the strong views work on the images' pixels
    std: tuple[float, ...]
    seed: int  # train.seed: the views' RNG's seed (with the rank)


class UniMatchSpec(Method):
    """G trained on a labeled batch and on two strong views of an unlabeled batch labelled by the
    weak view (V1: G itself; V2: its EMA teacher), with feature perturbation; D on top where
    ``loss.lambda_adv`` > 0. The registry's class: what both references declare alike, the rest
    from the declaration ``method.unimatch.variant`` names (``reference``)."""

    name = "unimatch"
    # None here: each reference's declaration names its own iteration, and from_config builds the
    # one the config's variant names.
    iteration_path = None
    config = UniMatchConfig
    # D on top: the weight of AdvSemiSeg's adversarial term on G's maps of the unlabeled images it
    # predicts with a gradient (V1: the weak view; V2: the two strong views). The references have
    # none: 0, and with 0 no D is built.
    lambda_adv_default = 0.0
    streams = STREAMS + (MIX_STREAM, GT_STREAM)  # every stream it may draw; data_streams: which
    losses = ("loss_seg", "loss_strong", "loss_fp", "pseudo_confidence", "loss_adv", "loss_d")
    d_losses = ("loss_d",)
    # the labeled batch's labelled pixels; the confident pixels of the strong views and of V1's
    # perturbed stream; D's: the gt batch's and G's labeled maps'
    selection_losses = ("loss_seg", "loss_strong", "loss_fp", "loss_d")
    diagnostics = ("train/loss_seg", "train/loss_strong", "train/pseudo_confidence", "train/loss_d")
    # What one reference draws and trains besides the labeled and unlabeled streams and G.
    reference_streams: ClassVar[tuple[StreamSpec, ...]] = ()
    reference_networks: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def reference(cls, cfg: Config) -> type[UniMatchSpec]:
        """The declaration of the reference ``method.unimatch.variant`` names: the one place the
        folder switches on the variant (tests/methods/test_unimatch.py counts them)."""
        return REFERENCES[cls.settings(cfg).variant]

    @classmethod
    def data_streams(cls, cfg: Config) -> tuple[StreamSpec, ...]:
        return (STREAMS + cls.reference(cfg).reference_streams
                + ((GT_STREAM,) if cls.adversarial_weight(cfg) > 0 else ()))

    @classmethod
    def networks(cls, cfg: Config) -> tuple[str, ...]:
        # G; the reference's own (V2's EMA teacher); D only where its term is on.
        return (("generator",) + cls.reference(cfg).reference_networks
                + (("discriminator",) if cls.adversarial_weight(cfg) > 0 else ()))

    @classmethod
    def from_config(cls, cfg: Config, nets: Mapping[str, Network], phases: PhaseTimer) -> Method:
        """The iteration of the reference the config names, built as every method's
        (``Method.from_config``): its declaration's ``iteration_class`` on the setup."""
        return cls.reference(cfg).iteration_class()(cls.setup(cfg), nets, phases)

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        return cls.adversarial_weight(cfg) > 0

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        super().check_config(cfg)
        if cfg.target_data is not None:
            raise UserError("target_data: method unimatch is semi-supervised (labeled and unlabeled images of one "
                            "domain); for domain adaptation use mean_teacher, adaptsegnet, advent or minent")

    @classmethod
    def setup(cls, cfg: Config) -> UniMatchSetup:
        norm = cfg.data.input_normalization
        return UniMatchSetup(**vars(super().setup(cfg)), settings=cls.settings(cfg), mean=norm.mean, std=norm.std,
                             seed=cfg.train.seed)


class UniMatchV1Spec(UniMatchSpec):
    """UniMatch (unimatch.py): a second unlabeled batch, pasted into the first's strong views."""

    iteration_path = "segadv.methods.unimatch.iteration:UniMatchV1"
    reference_streams = (MIX_STREAM,)


class UniMatchV2Spec(UniMatchSpec):
    """UniMatch V2 (unimatch_v2.py): G's EMA teacher, the ``teacher`` role."""

    iteration_path = "segadv.methods.unimatch.iteration:UniMatchV2"
    reference_networks = ("teacher",)


# method.unimatch.variant -> its reference's declaration
REFERENCES: dict[str, type[UniMatchSpec]] = {"v1": UniMatchV1Spec, "v2": UniMatchV2Spec}
