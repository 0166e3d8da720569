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


class DiscriminatorConfig(Section):
    kind: Literal["fc"] = "fc"
    ndf: int = Field(64, gt=0)


class ModelConfig(Section):
    generator: GeneratorConfig = GeneratorConfig()
    discriminator: DiscriminatorConfig = DiscriminatorConfig()


class SyntheticDataConfig(Section):
    image_size: int = Field(128, ge=32)
    train_size: int = Field(2000, gt=0)
    val_size: int = Field(200, gt=0)
    seed: int = 0


class DataConfig(Section):
    kind: Literal["synthetic"] = "synthetic"
    num_classes: int = Field(5, ge=2)
    ignore_index: int = 255
    batch_size: int = Field(8, gt=0)
    val_batch_size: int = Field(8, gt=0)
    num_workers: int = Field(1, ge=0)
    mean: list[float] = [0.485, 0.456, 0.406]
    std: list[float] = [0.229, 0.224, 0.225]
    # albumentations steps applied jointly to image and mask, e.g. {name: HorizontalFlip, p: 0.5}.
    # Normalize(mean, std) and ToTensorV2 are appended to both pipelines.
    train_transforms: list[dict[str, Any]] = [{"name": "HorizontalFlip", "p": 0.5}]
    val_transforms: list[dict[str, Any]] = []
    synthetic: SyntheticDataConfig = SyntheticDataConfig()


class OptimizerConfig(Section):
    name: Literal["sgd", "adam", "adamw"]
    lr: float = Field(gt=0)
    momentum: float = 0.9
    weight_decay: float = 0.0
    betas: list[float] = [0.9, 0.999]
    poly_power: float = 0.9  # lr = base_lr * (1 - step / max_steps) ** poly_power


class OptimConfig(Section):
    generator: OptimizerConfig = OptimizerConfig(
        name="sgd", lr=2.5e-4, momentum=0.9, weight_decay=5e-4
    )
    discriminator: OptimizerConfig = OptimizerConfig(name="adam", lr=1e-4, betas=[0.9, 0.99])


class LossConfig(Section):
    lambda_adv: float = Field(0.01, ge=0)
    adv_warmup_steps: int = Field(0, ge=0)  # G's update ignores D until this many steps have run


class NetworkAmpConfig(Section):
    enabled: bool = False
    dtype: Literal["float16", "bfloat16"] = "bfloat16"
    init_scale: float = Field(2.0**16, gt=0)  # GradScaler's starting loss scale (float16 only)


class AmpConfig(Section):
    generator: NetworkAmpConfig = NetworkAmpConfig()
    discriminator: NetworkAmpConfig = NetworkAmpConfig()


class TrainConfig(Section):
    max_steps: int = Field(20000, gt=0)
    eval_every: int = Field(1000, gt=0)
    log_every: int = Field(10, gt=0)
    seed: int = 0
    deterministic: bool = False


class CheckpointConfig(Section):
    every: int = Field(1000, gt=0)


class LogConfig(Section):
    tensorboard: bool = True
    num_images: int = Field(4, ge=0)  # val samples shown as image panels at each evaluation
    progress_bar: Optional[bool] = None  # None: a bar on a terminal, log lines otherwise


class Config(Section):
    # "g:1,d:0"; None picks cuda:0 for both when CUDA is available, else cpu.
    device_map: Optional[str] = None
    run_dir: Optional[str] = None  # None: runs/<config name>-<timestamp>
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    loss: LossConfig = LossConfig()
    amp: AmpConfig = AmpConfig()
    train: TrainConfig = TrainConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    log: LogConfig = LogConfig()
