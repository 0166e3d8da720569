"""The typed experiment config: every key, its type and its default.

Defaults follow AdvSemiSeg (Hung et al., 2018) where it has an opinion; ``configs/default.yaml``
(the embedded demo) overrides what a CPU-sized demo needs. Unknown keys are rejected
(``extra="forbid"``) and types are checked strictly, so a typo never silently does nothing.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


class GeneratorConfig(Section):
    arch: Literal["deeplabv3", "deeplabv3plus"] = "deeplabv3plus"
    encoder: str = "resnet18"
    # None: random init. A name ("imagenet") is passed to segmentation-models-pytorch (needs a
    # download); a path to a local file loads those encoder weights strictly.
    encoder_weights: Optional[str] = None
    encoder_depth: int = 5
    output_stride: Literal[8, 16] = 16
    # ASPP dilations. (12, 24, 36) suit ~512 px crops; on small images the feature map is only a
    # few cells wide and large rates sample mostly padding.
    decoder_atrous_rates: list[int] = [12, 24, 36]
    # Width of the decoder (ASPP and, for DeepLabV3+, the fusion convs); smp's default is 256.
    decoder_channels: int = Field(256, gt=0)
    # A second, auxiliary output from the encoder's second-to-last stage (a small classifier
    # there, upsampled to the input): AdaptSegNet's and ADVENT's multi-level adaptation. Training
    # only: evaluation, export, predict and segadv-ckpt convert use the main output.
    aux_head: bool = False
    # Training only: the encoder's stages and the decoder keep only their inputs for the backward
    # and run their forward again there (torch.utils.checkpoint, non-reentrant): less memory for
    # G's activations, about one more forward of them in time. Weights and files are unchanged.
    activation_checkpointing: bool = False


class DiscriminatorConfig(Section):
    # fc: AdvSemiSeg's fully convolutional D, a logit per pixel of a class-probability map.
    # image: s4GAN's image-level D, one logit per image from the image and its class maps.
    kind: Literal["fc", "image"] = "fc"
    ndf: int = Field(64, gt=0)
    # Stride-2 convolutions. fc: the last one is D's classifier and its logit map is the training
    # size halved this many times; 5 is the reference's (10x10 at 321 px, but 2x2 at 80 px: use 3
    # there). image: before the global pooling; 4 is the reference's. None: the kind's reference.
    num_downsamples: Optional[int] = Field(None, ge=1)
    # fc: how D's logit map is upsampled to the label size (bilinear). True: AdvSemiSeg's reference
    # (nn.Upsample(align_corners=True), which weighs the map's outer ring of cells less and shifts the
    # confidence map by up to half a cell against False; docs/methods.md "Deviations").
    align_corners: bool = True


class ModelConfig(Section):
    generator: GeneratorConfig = GeneratorConfig()
    discriminator: DiscriminatorConfig = DiscriminatorConfig()
    # The auxiliary output's D (multi-level domain adaptation); None: the same settings as D's.
    discriminator_aux: Optional[DiscriminatorConfig] = None


class SyntheticDataConfig(Section):
    image_size: int = Field(128, ge=32)
    train_size: int = Field(2000, gt=0)
    val_size: int = Field(200, gt=0)
    seed: int = 0
    # The look of the images (same shapes and classes): "source", or "target", a second domain
    # with other textures, colour statistics, blur, noise and lighting (domain adaptation).
    # "pretext": the source look with other shape classes (cross, star, hexagon, crescent), a task
    # to pretrain an encoder on (configs/pretext.yaml) that shares no image or label with the others.
    domain: Literal["source", "target", "pretext"] = "source"


# Dataset kinds and their layouts: docs/datasets.md. Relative paths inside the data section are
# taken from ``data.root``; ``data.root`` itself from the working directory.
DataKind = Literal["synthetic", "folder", "voc", "cityscapes", "gta5"]


class FolderSplitConfig(Section):
    images: str = "images"  # image directory
    masks: str = "masks"  # mask directory; a mask is matched to its image by file stem
    # A file of ids (file stems), one per line; None: every image in ``images``.
    list_file: Optional[str] = None


class FolderDataConfig(Section):
    train: FolderSplitConfig = FolderSplitConfig(images="train/images", masks="train/masks")
    val: FolderSplitConfig = FolderSplitConfig(images="val/images", masks="val/masks")
    image_suffixes: list[str] = [".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"]
    mask_suffix: str = ".png"
    class_names: Optional[list[str]] = None  # None: class_0, class_1, ...


class VocDataConfig(Section):
    # The SBD-augmented training set: SegmentationClassAug/ masks and train_aug.txt.
    augmented: bool = False
    # ImageSets/Segmentation/<name>.txt; None: train (train_aug when augmented).
    train_split: Optional[str] = None
    val_split: str = "val"


class CityscapesDataConfig(Section):
    train_split: str = "train"  # leftImg8bit/<split>/ and gtFine/<split>/
    val_split: str = "val"


class Gta5DataConfig(Section):
    train_list: Optional[str] = None  # a file of ids; None: every image not held out for val
    val_list: Optional[str] = None  # a file of ids; None: every val_every-th image (sorted)
    val_every: int = Field(20, ge=2)


class DataConfig(Section):
    kind: DataKind = "synthetic"
    root: Optional[str] = None  # the dataset directory (every kind but synthetic)
    # Each kind's own settings; only ``kind``'s section is read.
    synthetic: SyntheticDataConfig = SyntheticDataConfig()
    folder: FolderDataConfig = FolderDataConfig()
    voc: VocDataConfig = VocDataConfig()
    cityscapes: CityscapesDataConfig = CityscapesDataConfig()
    gta5: Gta5DataConfig = Gta5DataConfig()
    num_classes: int = Field(5, ge=2)
    ignore_index: int = 255
    # raise: a bad sample (unreadable, missing mask, size mismatch, bad label values) stops the
    # run with a message naming it; skip: it is dropped, counted and listed in RUN/skipped.json.
    on_error: Literal["raise", "skip"] = "raise"
    # Labeled / unlabeled split of the training set: a seeded fraction, or a file of ids. The
    # rest is an unlabeled pool whose masks are never read. Saved as RUN/data_split.json.
    labeled_fraction: float = Field(1.0, gt=0, le=1)
    labeled_list: Optional[str] = None
    labeled_seed: int = 0
    batch_size: int = Field(8, gt=0)
    val_batch_size: int = Field(8, gt=0)
    num_workers: int = Field(1, ge=0)
    pin_memory: bool = True  # only ever used when a CUDA device is
    persistent_workers: bool = True  # with num_workers > 0
    prefetch_factor: Optional[int] = Field(None, ge=1)  # with num_workers > 0; None: torch's 2
    drop_last: bool = True  # training batches only; val never drops
    mean: list[float] = [0.485, 0.456, 0.406]
    std: list[float] = [0.229, 0.224, 0.225]
    # albumentations steps applied jointly to image and mask, e.g. {name: HorizontalFlip, p: 0.5}.
    # Normalize(mean, std) and ToTensorV2 are appended to both pipelines.
    train_transforms: list[dict[str, Any]] = [{"name": "HorizontalFlip", "p": 0.5}]
    val_transforms: list[dict[str, Any]] = []


class OptimizerConfig(Section):
    name: Literal["sgd", "adam", "adamw"]
    lr: float = Field(gt=0)
    momentum: float = 0.9
    weight_decay: float = 0.0
    betas: list[float] = [0.9, 0.999]
    poly_power: float = 0.9  # lr = base_lr * (1 - step / max_steps) ** poly_power
    # torch's update kernels: auto = torch's choice (foreach on CUDA, a per-tensor loop on the
    # CPU); foreach = one multi-tensor op per group; fused = one fused kernel (CPU and CUDA).
    implementation: Literal["auto", "for_loop", "foreach", "fused"] = "auto"


class OptimConfig(Section):
    generator: OptimizerConfig = OptimizerConfig(
        name="sgd", lr=2.5e-4, momentum=0.9, weight_decay=5e-4
    )
    discriminator: OptimizerConfig = OptimizerConfig(name="adam", lr=1e-4, betas=[0.9, 0.99])
    discriminator_aux: Optional[OptimizerConfig] = None  # None: D's settings (its own instance)


class LossConfig(Section):
    lambda_adv: float = Field(0.01, ge=0)
    adv_warmup_steps: int = Field(0, ge=0)  # G's update ignores D until this many steps have run


class AdvSemiSegConfig(Section):
    """AdvSemiSeg's semi-supervised part (Hung et al., 2018); defaults are the reference's."""

    # Self-training: CE of G on its own argmax where D's confidence sigmoid(D(softmax G(x_u)))
    # reaches mask_threshold, from step semi_start on.
    lambda_semi: float = Field(0.1, ge=0)
    mask_threshold: float = Field(0.2, ge=0, le=1)
    # Not the reference's: when set, the threshold of each batch is this quantile of D's confidence
    # over its unlabeled pixels (0.2: the fifth D is least sure of is ignored), so the mask uses D's
    # ranking of pixels whatever its calibration; mask_threshold is then unused.
    mask_quantile: Optional[float] = Field(None, gt=0, lt=1)
    semi_start: int = Field(5000, ge=0)
    # Adversarial term on unlabeled predictions (G tries to make them look real), from semi_start_adv.
    lambda_semi_adv: float = Field(0.001, ge=0)
    semi_start_adv: int = Field(0, ge=0)
    # D also takes G's unlabeled predictions as fake (the reference's --D-remain, on by default).
    d_sees_unlabeled: bool = True
    unlabeled_batch_size: Optional[int] = Field(None, gt=0)  # None: data.batch_size


class S4GanConfig(Section):
    """s4GAN's terms (Mittal et al., TPAMI 2019); defaults are the reference's for VOC."""

    # Feature matching: L1 between the batch means of D's pooled features on real (a labeled image
    # with its one-hot labels) and on fake (an unlabeled image with G's softmax), G's adversarial term.
    lambda_fm: float = Field(0.1, ge=0)
    # Self-training: CE of G on its argmax over the unlabeled images whose D score
    # sigmoid(D(x_u, softmax G(x_u))) exceeds threshold (whole images), from step st_start on
    # (the reference's: from its second iteration). Threshold: 0.6 VOC, 0.7 Cityscapes.
    lambda_st: float = Field(1.0, ge=0)
    threshold: float = Field(0.6, ge=0, le=1)
    st_start: int = Field(1, ge=0)
    unlabeled_batch_size: Optional[int] = Field(None, gt=0)  # None: data.batch_size


class DomainAdaptationConfig(Section):
    """Unsupervised domain adaptation from the labeled source (``data``) to the unlabeled target
    (``target_data``). Levels: main, and aux when ``model.generator.aux_head`` (multi-level).
    Defaults: AdaptSegNet's multi-level weights (docs/methods.md "Domain adaptation")."""

    lambda_seg_aux: float = Field(0.1, ge=0)  # source CE of the aux output
    lambda_adv_main: float = Field(0.001, ge=0)  # target maps made to look like source, main level
    lambda_adv_aux: float = Field(0.0002, ge=0)
    lambda_ent_main: float = Field(0.0, ge=0)  # mean normalised target entropy (MinEnt)
    lambda_ent_aux: float = Field(0.0, ge=0)
    gan: Literal["bce", "ls"] = "bce"  # least squares: MSE on D's logits
    target_batch_size: Optional[int] = Field(None, gt=0)  # None: data.batch_size


class MinEntConfig(DomainAdaptationConfig):
    """ADVENT's MinEnt: no discriminator, the target's entropy minimised."""

    lambda_adv_main: float = Field(0.0, ge=0)
    lambda_adv_aux: float = Field(0.0, ge=0)
    lambda_ent_main: float = Field(0.001, ge=0)
    lambda_ent_aux: float = Field(0.0002, ge=0)


class MethodConfig(Section):
    """What one training iteration does (docs/methods.md).

    supervised: CE + lambda_adv * adversarial on labeled images, D on G's maps vs the same batch's
    labels (``loss.lambda_adv: 0`` is the CE-only baseline). advsemiseg: AdvSemiSeg's iteration
    with three data streams (labeled, unlabeled, and a labeled batch D sees as real). s4gan:
    s4GAN's iteration on the same three streams (an image-level D, ``model.discriminator.kind: image``).
    adaptsegnet / advent / minent: domain adaptation, source and target streams (D on softmax
    maps / on self-information maps / no D).
    """

    name: Literal["supervised", "advsemiseg", "s4gan", "adaptsegnet", "advent", "minent"] = "supervised"
    advsemiseg: AdvSemiSegConfig = AdvSemiSegConfig()
    s4gan: S4GanConfig = S4GanConfig()
    adaptsegnet: DomainAdaptationConfig = DomainAdaptationConfig()
    advent: DomainAdaptationConfig = DomainAdaptationConfig()
    minent: MinEntConfig = MinEntConfig()


class NetworkAmpConfig(Section):
    enabled: bool = False
    dtype: Literal["float16", "bfloat16"] = "bfloat16"
    init_scale: float = Field(2.0**16, gt=0)  # GradScaler's starting loss scale (float16 only)


class AmpConfig(Section):
    generator: NetworkAmpConfig = NetworkAmpConfig()
    discriminator: NetworkAmpConfig = NetworkAmpConfig()
    discriminator_aux: Optional[NetworkAmpConfig] = None  # None: D's setting (its own GradScaler)


class ParallelConfig(Section):
    """Each network is wrapped on its own (never one wrapper around both).

    auto: ddp under a multi-process launch, dp when the device map lists a replica set
    (``g:1+2``), else none.
    """

    generator: Literal["auto", "none", "dp", "ddp"] = "auto"
    discriminator: Literal["auto", "none", "dp", "ddp"] = "auto"
    discriminator_aux: Optional[Literal["auto", "none", "dp", "ddp"]] = None  # None: D's
    sync_bn: bool = False  # convert G's BatchNorm to SyncBatchNorm under DDP


class CompileConfig(Section):
    """``torch.compile`` per network (docs/training.md "Compiling"): each network's forward (and so its
    backward) compiled on its own device, in place, so parameter names, state dicts, checkpoints and
    the wrappers see the same module; the hand-over between devices, the losses, the GradScaler and
    the optimizer steps stay eager. Evaluation (eval mode, no_grad) and each new batch size may
    compile once more; after the first evaluation no step recompiles."""

    generator: bool = False
    discriminator: bool = False  # also the aux D, unless discriminator_aux says otherwise
    discriminator_aux: Optional[bool] = None  # None: D's setting
    # torch.compile's mode; None: its default. reduce-overhead adds CUDA graphs on CUDA devices.
    mode: Optional[Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]] = None
    # inductor generates kernels (C++ on the CPU: needs a C++ compiler; Triton on CUDA). aot_eager
    # traces forward and backward as inductor does but runs them with torch's own kernels (no code
    # generation: fast to compile, no speed-up); eager is the graph capture alone. Both check a
    # model's compilability in seconds.
    backend: Literal["inductor", "aot_eager", "eager"] = "inductor"


class TrainConfig(Section):
    max_steps: int = Field(20000, gt=0)
    eval_every: int = Field(1000, gt=0)
    log_every: int = Field(10, gt=0)
    seed: int = 0
    deterministic: bool = False
    # linear: multiply both learning rates by the world size (DDP: the global batch grows with it).
    lr_scaling: Literal["none", "linear"] = "none"
    # Both networks' weights (and so their activations) in channels_last memory format.
    channels_last: bool = False
    # With target_data: also evaluate data's (the source's) val split at each evaluation, logged
    # as val_source/mIoU and val_source/pixel_acc (val/* stays the target's).
    eval_source: bool = False
    # Precise per-phase timing: synchronise the device around every phase of the step (costs a
    # sync per phase on CUDA). Off: CUDA events, read at log time (segadv/monitor/profile.py).
    profile: bool = False
    # A non-finite loss or weight (docs/failures.md). stop: end the run (exit 3), nothing non-finite
    # saved. skip_step: skip each network's update whose gradients are non-finite (a GradScaler
    # held at scale 1 where no fp16 one runs: a host read of its flag per step), counted and logged.
    on_nonfinite: Literal["stop", "skip_step"] = "stop"
    # Gradient accumulation: each optimizer step over K micro-batches, each stream's batch cut into
    # K equal parts (K must divide every stream's batch size); the schedule counts optimizer steps.
    accumulation_steps: int = Field(1, gt=0)


class CheckpointConfig(Section):
    every: int = Field(1000, gt=0)
    # Keep only the newest K step_<N>.pt files (None: keep all); last.pt is always kept.
    keep_last: Optional[int] = Field(None, ge=1)


class InitSource(Section):
    path: str
    # Glob patterns of model keys NOT taken from the file (they keep their fresh init), e.g.
    # ["segmentation_head.*"] to start from weights trained with another number of classes.
    exclude: list[str] = []


class InitConfig(Section):
    """Weights to start from (any format the checkpoint loader accepts); strict unless excluded."""

    generator: Optional[InitSource] = None
    discriminator: Optional[InitSource] = None


class LogConfig(Section):
    tensorboard: bool = True
    num_images: int = Field(4, ge=0)  # val samples shown as image panels at each evaluation
    # Unlabeled training images whose masks (never read by training) measure at each evaluation
    # whether D's confidence knows which of G's pixels are right (diag/d_confidence_auroc,
    # diag/d_mask_precision), in chunks of num_images (the method's panel); 0: off. Only for a
    # method with a panel on a pool whose masks exist (the synthetic data's).
    diagnostic_images: int = Field(16, ge=0)
    progress_bar: Optional[bool] = None  # None: a bar on a terminal, log lines otherwise
    # "D wins outright" (segadv/monitor/diagnostics.py): one warning when D's loss stays below
    # d_wins_loss at d_wins_steps consecutive log steps. The bound is on BCE's scale (healthy
    # AdvSemiSeg runs sit at 0.2-0.5; chance is ln 2 = 0.69); None: no check.
    d_wins_loss: Optional[float] = Field(0.2, gt=0)
    d_wins_steps: int = Field(10, ge=1)


class Config(Section):
    # "g:1,d:0"; None picks cuda:0 for both when CUDA is available, else cpu.
    device_map: Optional[str] = None
    run_dir: Optional[str] = None  # None: runs/<config name>-<timestamp>
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    # Domain adaptation's unlabeled target domain: its train images (masks never read) and its
    # val split, on which val/* is then measured (train.eval_source adds data's as val_source/*).
    target_data: Optional[DataConfig] = None
    optim: OptimConfig = OptimConfig()
    loss: LossConfig = LossConfig()
    method: MethodConfig = MethodConfig()
    amp: AmpConfig = AmpConfig()
    parallel: ParallelConfig = ParallelConfig()
    compile: CompileConfig = CompileConfig()
    train: TrainConfig = TrainConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    init: InitConfig = InitConfig()
    log: LogConfig = LogConfig()
