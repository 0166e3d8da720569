"""The typed experiment config: every key, its type, its default, its range and one line of meaning.

Defaults follow AdvSemiSeg (Hung et al., 2018) where it has an opinion; ``configs/default.yaml``
(the embedded demo) overrides what a CPU-sized demo needs. Unknown keys are rejected
(``extra="forbid"``) and types are checked strictly, so a typo never silently does nothing.

Every value is range-checked here, so torch and smp never see one they would fail on: floats are
finite (``allow_inf_nan=False`` for the whole schema), counts and sizes have bounds, lists their
lengths; what needs two keys (an encoder depth against the architecture) is a validator naming
the key. What needs the data (D's depth against the smallest training image, batches of one) is
checked before the first step (segadv/training/checks.py, segadv/data/batch_checks.py). Every field carries a
one-line ``description`` (tests/config/test_schema.py insists), the line a key listing shows;
tests/config/test_schema_bounds.py tries every numeric and list field at its boundaries.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal, Mapping, Optional

from pydantic import Field, SerializeAsAny, ValidationInfo, field_validator, model_validator

# Each data kind's section, the per-network sections and their entries are the config's like any
# section; their own modules hold them.
from segadv.config.data_kinds import (  # noqa: F401
    CityscapesDataConfig,
    FolderDataConfig,
    FolderSplitConfig,
    Gta5DataConfig,
    SyntheticDataConfig,
    VocDataConfig,
)
from segadv.config.generator_section import GeneratorConfig  # noqa: F401
from segadv.config.method_section import MethodConfig, registered_methods  # noqa: F401
from segadv.config.network_sections import (
    AmpConfig,
    CompileConfig,
    InitConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    section_default,
)
from segadv.config.network_settings import (  # noqa: F401
    DiscriminatorConfig,
    InitSource,
    NetworkAmpConfig,
    OptimizerConfig,
)
from segadv.config.normalization import NORMALIZATIONS, Normalization, resolve as resolve_normalization
from segadv.config.section import Beta, Count, Probability, Section, Seed, Weight, registered_choice  # noqa: F401


# Dataset kinds and their layouts: docs/datasets.md. Relative paths inside the data section are
# taken from ``data.root``; ``data.root`` itself from the working directory.
DataKind = Literal["synthetic", "folder", "voc", "cityscapes", "gta5"]


class DataConfig(Section):
    kind: DataKind = Field("synthetic", description="dataset kind: synthetic, folder, voc, cityscapes or gta5 (docs/datasets.md)")
    root: Optional[str] = Field(None, min_length=1, description="the dataset directory (every kind but synthetic)")
    synthetic: SyntheticDataConfig = Field(SyntheticDataConfig(), description="kind synthetic: the generated shapes")
    folder: FolderDataConfig = Field(FolderDataConfig(), description="kind folder: images and masks in directories")
    voc: VocDataConfig = Field(VocDataConfig(), description="kind voc: Pascal VOC 2012 (and SBD)")
    cityscapes: CityscapesDataConfig = Field(CityscapesDataConfig(), description="kind cityscapes: its splits")
    gta5: Gta5DataConfig = Field(Gta5DataConfig(), description="kind gta5: its train / val split")
    # mmseg's test_dataloader: scored by segadv-eval --split test alone, never listed by training.
    test: Optional[str] = Field(
        None, min_length=1, description="the test split (segadv-eval --split test), named as the kind names its val "
        "split: voc ImageSets/Segmentation/<name>.txt, cityscapes leftImg8bit/<name>/ and gtFine/<name>/, folder "
        "<name>/images and <name>/masks (or data.folder.test), gta5 a file of ids, synthetic the generated split <name> "
        "(data.synthetic.test_size samples); null: none. Training never reads it")
    num_classes: int = Field(
        5, ge=2, description="number of classes (ids 0..num_classes-1); at most 255, masks being 8-bit")
    ignore_index: int = Field(
        255, ge=0, le=255, description="mask value that is not a class (not scored, no loss); 0..255, not a class id")
    # raise: a bad sample stops the run with a message naming it; skip: it is dropped, counted and
    # listed in RUN/skipped.json.
    on_error: Literal["raise", "skip"] = Field(
        "raise", description="a bad sample: raise stops with its name; skip drops it and lists it in RUN/skipped.json")
    labeled_fraction: float = Field(
        1.0, gt=0, le=1,
        description="seeded fraction of the training set that is labeled; the rest is an unlabeled pool whose "
        "masks are never read")
    labeled_list: Optional[str] = Field(
        None, min_length=1, description="a file of the labeled ids (replaces labeled_fraction); saved split: RUN/data_split.json")
    labeled_seed: Seed = Field(0, description="seed of the labeled / unlabeled split")
    batch_size: int = Field(
        8, gt=0, le=10**6,
        description="training batch per process and stream (G's BatchNorm needs 2 or more per micro-batch)")
    val_batch_size: int = Field(8, gt=0, le=10**6, description="evaluation batch per process")
    num_workers: int = Field(1, ge=0, le=256, description="DataLoader worker processes per loader (0: in the main process)")
    pin_memory: bool = Field(True, description="pin host batches (only used when a CUDA device consumes them)")
    persistent_workers: bool = Field(True, description="keep the workers between epochs (with num_workers > 0)")
    prefetch_factor: Optional[int] = Field(
        None, ge=1, le=64, description="batches each worker loads ahead (with num_workers > 0); null: torch's 2")
    drop_last: bool = Field(
        True, description="drop each epoch's last partial training batch (val never drops); false refuses a last batch of one")
    # Which convention G's input follows (segadv/config/normalization.py): the weights G starts from
    # were trained on one, and everything that undoes or reproduces it (panels, export, predict) reads it.
    normalization: Literal[tuple(NORMALIZATIONS)] = Field(  # type: ignore[valid-type]
        "imagenet", description="G's input: imagenet (RGB, data.mean / data.std), caffe_bgr (BGR less the Caffe "
        "mean, no std: AdaptSegNet, ADVENT) or caffe_rgb (RGB less it: AdvSemiSeg, s4GAN); docs/datasets.md")
    # On the 0..1 scale of albumentations' Normalize (pixels divided by 255 first).
    mean: list[Probability] = Field(
        [0.485, 0.456, 0.406], min_length=3, max_length=3,
        description="per-channel RGB mean of Normalize, each in 0..1 (normalization imagenet)")
    std: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        [0.229, 0.224, 0.225], min_length=3, max_length=3,
        description="per-channel RGB std of Normalize, each in (0, 1] (normalization imagenet)")
    # Normalize(mean, std) and ToTensorV2 are appended to both pipelines.
    train_transforms: list[dict[str, Any]] = Field(
        [{"name": "HorizontalFlip", "p": 0.5}],
        description="albumentations steps on image and mask, e.g. {name: HorizontalFlip, p: 0.5}; Normalize and ToTensorV2 appended")
    val_transforms: list[dict[str, Any]] = Field([], description="albumentations steps for val (same form)")
    # AdaptSegNet's and ADVENT's evaluation (Cityscapes at [1024, 512]): G predicts at a smaller
    # input and its output is upsampled to the label; the label keeps its size, so the scores are
    # at full resolution. [W, H] as theirs (PIL's size order). Null: G predicts at the image's size.
    val_input_size: Optional[list[Annotated[int, Field(ge=16, le=16384)]]] = Field(
        None, min_length=2, max_length=2,
        description="[W, H] each val image is resized to (bicubic, after data.val_transforms) before G; G's "
        "raw output upsampled to the full-size label (null: predict at the image's size); docs/datasets.md")
    # UniMatch V2's evaluation (its supervised.py evaluate, multiplier=14): any val size reaches G.
    val_resize_to_multiple: bool = Field(
        False, description="resize each val image (bilinear, align_corners) to the nearest multiple of G's input "
        "divisor (DINOv2: 14) before G, G's logits back to the label's size; docs/datasets.md")

    @field_validator("num_classes")
    @classmethod
    def _fits_masks(cls, n: int) -> int:
        if n > 255:
            raise ValueError(f"masks are 8-bit, so at most 255 classes (ids 0..254, 255 left for "
                             f"data.ignore_index); got {n}")
        return n

    @model_validator(mode="after")
    def _one_val_resize(self) -> "DataConfig":
        if self.val_resize_to_multiple and self.val_input_size is not None:
            raise ValueError("val_input_size and val_resize_to_multiple both resize the val images before G: "
                             "set one (val_input_size: null, or val_resize_to_multiple: false)")
        return self

    @model_validator(mode="after")
    def _mean_std_belong_to_the_normalization(self) -> "DataConfig":
        # A convention that fixes its own mean and std would silently ignore data.mean / data.std.
        if not NORMALIZATIONS[self.normalization].takes_mean_std:
            for key in ("mean", "std"):
                if getattr(self, key) != type(self).model_fields[key].default:
                    raise ValueError(f"data.{key}: normalization {self.normalization} fixes its own mean and std "
                                     f"(docs/datasets.md); leave data.{key} out, or use normalization imagenet")
        return self

    @property
    def input_normalization(self) -> Normalization:
        """The convention G's input follows, resolved: channel order, mean and std."""
        return resolve_normalization(self.normalization, self.mean, self.std)


class LossConfig(Section):
    # One key for every method (issue 50); its old names (method.adaptsegnet.lambda_adv_main, ...)
    # still read, with a note: segadv/config/renamed.py. Each method's default and refusal are on its
    # class (segadv/methods/base.py Method.adversarial_weight, the one reader of the key).
    lambda_adv: Optional[Weight] = Field(
        None, description="weight of G's adversarial term (adaptation: the main level's; 0: off). null: the "
                          "method's reference default: supervised and advsemiseg 0.01 (on labeled images), "
                          "adaptsegnet and advent 0.001, mean_teacher 0 (no D is built); minent has no such "
                          "term (0 only), nor has s4gan (its term is method.s4gan.lambda_fm)")
    adv_warmup_steps: int = Field(0, ge=0, le=10**9, description="G's update ignores D until this many steps have run")


# The label-free scores logged at each evaluation of a run with unlabeled or target data
# (segadv/engine/proxies.py), each with its direction: True where higher is better.
PROXY_SCORES: dict[str, bool] = {"entropy": False, "flip_agreement": True, "scale_agreement": True, "snd": True,
                                 "d_confidence": True}
BEST_BY = ("val/mIoU", *(f"proxy/{name}" for name in PROXY_SCORES))
# What train.early_stop may watch: an evaluation's val scores (the labels') and the label-free ones.
EARLY_STOP_SCORES = ("val/mIoU", "val/pixel_acc", *BEST_BY[1:])


def higher_is_better(score: str) -> bool:
    """The direction of a ``checkpoint.best_by`` or ``train.early_stop.monitor`` score: the val
    labels' scores and every proxy but entropy are better higher."""
    return score.startswith("val/") or PROXY_SCORES[score.removeprefix("proxy/")]


class EarlyStopConfig(Section):
    monitor: Optional[Literal[EARLY_STOP_SCORES]] = Field(  # type: ignore[valid-type]
        None, description="the evaluation score watched: val/mIoU, val/pixel_acc or a label-free proxy/* score, in its "
                          "direction (proxy/entropy: lower; the others: higher); null: no early stop")
    patience: int = Field(
        3, ge=1, le=10**6,
        description="stop after this many evaluations in a row that do not improve on the best monitor score so far")
    min_delta: float = Field(
        0.0, ge=0, le=100,
        description="an improvement is a better score by at least this much (0: any better score)")


class TrainConfig(Section):
    max_steps: Count = Field(20000, description="optimizer steps of the run")
    eval_every: Count = Field(1000, description="evaluate on val every this many steps (and at the end)")
    log_every: Count = Field(10, description="log losses (and check them for NaN) every this many steps")
    seed: Seed = Field(0, description="training seed: weights, data order, augmentation (each rank adds its rank)")
    deterministic: bool = Field(False, description="bitwise-repeatable kernels where torch has them")
    lr_scaling: Literal["none", "linear"] = Field(
        "none", description="linear: multiply both learning rates by the world size (DDP's global batch grows with it)")
    channels_last: bool = Field(False, description="both networks' weights and activations in channels_last memory format")
    eval_source: bool = Field(
        False, description="with target_data: also evaluate the source val split (val_source/*; val/* stays the target's)")
    profile: bool = Field(
        False, description="precise per-phase timing: synchronise the device around every phase (a sync per phase on CUDA)")
    # skip_step: a GradScaler held at scale 1 where no fp16 one runs: a host read of its flag per step.
    on_nonfinite: Literal["stop", "skip_step"] = Field(
        "stop", description="a non-finite loss or weight: stop (exit 3, nothing non-finite saved) or skip_step (skip that update)")
    on_discriminator_collapse: Literal["warn", "stop"] = Field(
        "warn", description="D leaves its band (log.d_wins_loss, log.d_collapse_loss): warn, or stop (a checkpoint, outcome stopped)")
    accumulation_steps: int = Field(
        1, gt=0, le=1024,
        description="micro-batches per optimizer step; must divide every stream's batch, leaving 2 or more per micro-batch")
    early_stop: EarlyStopConfig = Field(
        EarlyStopConfig(), description="stop when an evaluation score stops improving (Lightning's EarlyStopping)")
    smoke: bool = Field(
        False, description="a smoke run (Lightning's fast_dev_run): 2 steps, one evaluation on at most 2 val batches, a "
        "checkpoint saved and read back, all in a throwaway run dir removed at its end: nothing kept (docs/training.md)")


def best_score_by(best: Mapping[str, Any]) -> str:
    """The score a ``best`` record (best.json, a checkpoint's ``best``) was chosen by; a record
    without ``by`` (chosen by the val labels, or written before checkpoint.best_by): val/mIoU."""
    return str(best.get("by", "val/mIoU"))


class CheckpointConfig(Section):
    every: Count = Field(1000, description="write step_<N>.pt and last.pt every this many steps (and at the end)")
    keep_last: Optional[int] = Field(
        None, ge=1, le=10**6, description="keep only the newest K step_<N>.pt files (null: all); last.pt is always kept")
    keep_best: Optional[int] = Field(
        None, ge=1, le=10**6,
        description="also keep the K best evaluations by best_by as best_step_<N>_<score>_<value>.pt (null: only "
                    "best.pt, the single best, which stays either way)")
    best_by: Literal[BEST_BY] = Field(  # type: ignore[valid-type]
        "val/mIoU", description="the score best.pt is chosen by: val/mIoU (the val labels; in adaptation the "
                                "target's) or a label-free proxy/* score, each in its direction (entropy: lowest; "
                                "the others: highest)")


class WandbConfig(Section):
    """Weights & Biases beside TensorBoard (segadv/monitor/trackers.py): Lightning's WandbLogger,
    mmseg's WandbVisBackend."""

    enabled: bool = Field(
        False, description="log the scalars, the image panels and the resolved config to W&B too (rank 0; needs "
                           "pip install 'segadv[wandb]')")
    mode: Literal["offline", "online"] = Field(
        "offline", description="offline: written under RUN/wandb only (upload later: wandb sync RUN/wandb/offline-run-*); "
                               "online: sent as the run goes (needs wandb login and the network)")
    project: str = Field("segadv", min_length=1, max_length=128, description="the W&B project")
    entity: Optional[str] = Field(None, min_length=1, description="the W&B user or team; null: the account's default")
    name: Optional[str] = Field(None, min_length=1, description="the W&B run's display name; null: the run dir's name")
    tags: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        [], max_length=100, description="the W&B run's tags")


class MlflowConfig(Section):
    """MLflow beside TensorBoard (segadv/monitor/trackers.py): Lightning's MLFlowLogger, mmseg's
    MLflowVisBackend."""

    enabled: bool = Field(
        False, description="log the scalars (metrics), the image panels and the resolved config (params, artifact "
                           "config.yaml) to MLflow too (rank 0; needs pip install 'segadv[mlflow]')")
    tracking_uri: Optional[str] = Field(
        None, min_length=1, description="where the MLflow run goes: a tracking server (http://host:5000), a store "
                                        "URI (file:/path, databricks); null: the run dir's own file store, RUN/mlruns")
    experiment: str = Field("segadv", min_length=1, max_length=500, description="the MLflow experiment (created if missing)")
    run_name: Optional[str] = Field(None, min_length=1, description="the MLflow run's name; null: the run dir's name")


class LogConfig(Section):
    tensorboard: bool = Field(True, description="write TensorBoard events in the run dir")
    wandb: WandbConfig = Field(WandbConfig(), description="Weights & Biases, beside TensorBoard")
    mlflow: MlflowConfig = Field(MlflowConfig(), description="MLflow, beside TensorBoard")
    num_images: int = Field(4, ge=0, le=64, description="images per panel at each evaluation: val samples, the "
                            "method's panel, its last training batch (train/mixed_batch); 0: those panels off")
    # Only for a method with a panel on a pool whose masks exist (the synthetic data's).
    diagnostic_images: int = Field(
        16, ge=0, le=4096,
        description="unlabeled images whose masks measure D's confidence at each evaluation (diag/*); 0: off")
    progress_bar: Optional[bool] = Field(None, description="a progress bar; null: on a terminal, log lines otherwise")
    # D's health (docs/training.md "D's health"): a band for D's loss and its accuracies, on the
    # references' scale (AdvSemiSeg's loss_D: the mean of D's BCE on real and fake; its issue #39
    # calls 0.2-0.5 healthy; chance is ln 2 = 0.693). The supervised method logs the sum of the two,
    # so its bounds are doubled; an ls GAN's squared errors are not checked.
    d_wins_loss: Optional[float] = Field(
        0.2, gt=0, le=100,
        description="\"D wins outright\": D's loss below this at d_wins_steps consecutive log steps; null: not checked")
    d_wins_steps: int = Field(
        10, ge=1, le=10**6, description="the window: consecutive log steps out of D's band before a warning (either condition)")
    d_overpowers_loss: Optional[float] = Field(
        0.02, gt=0, le=100,
        description="\"D wins outright\" warns where D's loss stays below this over the window (D overpowers G: act on D's lr) "
                    "or G's loss_seg did not fall over it (act on G's lr, loss.lambda_adv); null: only the latter")
    d_collapse_loss: Optional[float] = Field(
        0.69, gt=0, le=100,
        description="\"D collapsed\": D's loss at or above this (chance ln 2 = 0.693) at d_wins_steps consecutive log "
                    "steps, once it was below; null: not checked")
    d_collapse_accuracy: float = Field(
        0.55, ge=0, le=1,
        description="\"D collapsed\" also needs the mean of D's accuracies on real and fake (where logged) at most this (0.5: chance)")
    d_unstable_loss: Optional[float] = Field(
        1.4, gt=0, le=100,
        description="\"D unstable\": D's loss at or above this (about twice chance; a calibrated D stays at or below ln 2) at "
                    "2 of the last d_wins_steps log steps, once it was below d_collapse_loss, its accuracies above "
                    "d_collapse_accuracy: D confidently wrong, its steps overshoot (act on D's lr); null: not checked")


class Config(Section):
    device_map: Optional[str] = Field(
        None, min_length=1, description="where networks run, e.g. \"g:1,d:0\"; null: cuda:0 for both when CUDA is available, else cpu")
    run_dir: Optional[str] = Field(
        None, description="the run's directory (~ expanded); null: runs/<config name>-<timestamp>; a run's config.yaml stores null")
    model: SerializeAsAny[ModelConfig] = Field(default_factory=section_default(ModelConfig), description="the networks")
    data: DataConfig = Field(DataConfig(), description="the training data (domain adaptation: the labeled source)")
    target_data: Optional[DataConfig] = Field(
        None, description="domain adaptation's unlabeled target: its train images and the val split val/* is measured on")
    optim: SerializeAsAny[OptimConfig] = Field(default_factory=section_default(OptimConfig),
                                               description="optimizers and their schedules")
    loss: LossConfig = Field(LossConfig(), description="G's adversarial weight (every method's) and the labeled term's warm-up (supervised, advsemiseg)")
    method: SerializeAsAny[MethodConfig] = Field(default_factory=lambda: MethodConfig.model_validate({}),
                                                 description="what one training iteration does")
    amp: SerializeAsAny[AmpConfig] = Field(default_factory=section_default(AmpConfig),
                                           description="mixed precision per network")
    parallel: SerializeAsAny[ParallelConfig] = Field(default_factory=section_default(ParallelConfig),
                                                     description="wrappers per network (DataParallel, DDP)")
    compile: SerializeAsAny[CompileConfig] = Field(default_factory=section_default(CompileConfig),
                                                   description="torch.compile per network")
    train: TrainConfig = Field(TrainConfig(), description="the training loop")
    checkpoint: CheckpointConfig = Field(CheckpointConfig(), description="checkpoint files")
    init: SerializeAsAny[InitConfig] = Field(default_factory=section_default(InitConfig),
                                             description="weights to start from")
    log: LogConfig = Field(LogConfig(), description="what a run reports")

    @field_validator("target_data")
    @classmethod
    def _target_classes_are_gs(cls, target: Optional[DataConfig], info: ValidationInfo) -> Optional[DataConfig]:
        # G has one output per class of data.num_classes: a target of another class count would be
        # scored (and pseudo-labeled) against ids G does not have.
        data = info.data.get("data")
        if target is not None and data is not None and target.num_classes != data.num_classes:
            raise ValueError(
                f"target_data.num_classes={target.num_classes} differs from data.num_classes={data.num_classes} "
                "(G's classes): the target is scored with G's classes; set both to the same")
        return target

    @field_validator("run_dir")
    @classmethod
    def _user_path(cls, value: Optional[str]) -> Optional[str]:
        """``~`` expanded as in every path option; an empty path (an unset shell variable) would
        be the current dir, so it is refused (segadv/fsutil.py ``user_path``)."""
        if value is None:
            return None
        if not value.strip():
            raise ValueError("the path is empty (an unset shell variable?); name a directory or leave it out")
        return os.path.expanduser(value)
