"""Each ``data.kind``'s own settings (``data.synthetic``, ``data.folder``, ``data.voc``,
``data.cityscapes``, ``data.gta5``): where the kind keeps its splits, read by
``segadv/data/layouts.py``; the layouts are in docs/datasets.md. Part of the schema
(``segadv/config/schema.py``), under its rules: every field range-checked and described.
Relative paths are taken from ``data.root``."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field

from segadv.config.section import Section, Seed


class SyntheticDataConfig(Section):
    image_size: int = Field(128, ge=32, le=2048, description="side of the square generated images, pixels")
    train_size: int = Field(2000, gt=0, le=10**7, description="number of generated training samples")
    val_size: int = Field(200, gt=0, le=10**7, description="number of generated val samples")
    test_size: int = Field(200, gt=0, le=10**7, description="number of generated test samples (with data.test)")
    seed: Seed = Field(0, description="seed of the generated dataset (each sample a function of seed, split, index)")
    # "pretext": the source look with other shape classes, a task to pretrain an encoder on
    # (configs/pretext.yaml) that shares no image or label with the others.
    domain: Literal["source", "target", "pretext"] = Field(
        "source",
        description="look of the images: source, target (other textures and lighting, for domain "
        "adaptation) or pretext (other shape classes)")


class FolderSplitConfig(Section):
    images: str = Field("images", min_length=1, description="image directory (relative: from data.root)")
    masks: str = Field("masks", min_length=1, description="mask directory; a mask matches its image by file stem")
    list_file: Optional[str] = Field(
        None, min_length=1, description="a file of ids (file stems), one a line; null: every image in images")


class FolderDataConfig(Section):
    train: FolderSplitConfig = Field(
        FolderSplitConfig(images="train/images", masks="train/masks"), description="the training split's files")
    val: FolderSplitConfig = Field(
        FolderSplitConfig(images="val/images", masks="val/masks"), description="the val split's files")
    test: Optional[FolderSplitConfig] = Field(
        None, description="the test split's files (with data.test); null: <data.test>/images and <data.test>/masks")
    image_suffixes: list[Annotated[str, Field(min_length=1)]] = Field(
        [".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"], min_length=1,
        description="image file suffixes listed (any case)")
    mask_suffix: str = Field(".png", min_length=1, description="mask file suffix")
    class_names: Optional[list[Annotated[str, Field(min_length=1)]]] = Field(
        None, min_length=2, description="one name per class; null: class_0, class_1, ...")


class VocDataConfig(Section):
    augmented: bool = Field(False, description="train on the SBD-augmented set (SegmentationClassAug/, train_aug.txt)")
    train_split: Optional[str] = Field(
        None, min_length=1, description="ImageSets/Segmentation/<name>.txt for training; null: train (train_aug when augmented)")
    val_split: str = Field("val", min_length=1, description="ImageSets/Segmentation/<name>.txt for val")


class CityscapesDataConfig(Section):
    train_split: str = Field("train", min_length=1, description="leftImg8bit/<split>/ and gtFine/<split>/ for training")
    val_split: str = Field("val", min_length=1, description="leftImg8bit/<split>/ and gtFine/<split>/ for val")


class Gta5DataConfig(Section):
    train_list: Optional[str] = Field(
        None, min_length=1,
        description="a file of training ids; null: every image not held out for val (must not share ids with val)")
    val_list: Optional[str] = Field(None, min_length=1, description="a file of val ids; null: every val_every-th image (sorted)")
    val_every: int = Field(20, ge=2, le=10**6, description="without val_list: every val_every-th image is held out for val")
