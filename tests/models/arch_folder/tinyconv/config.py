"""tinyconv's ``model.generator`` section: the keys every arch takes, and its own width."""

from typing import ClassVar

from pydantic import Field

from segadv.config.generator_section import GeneratorConfig, arch_field


class TinyConvConfig(GeneratorConfig):
    arch: str = arch_field("tinyconv")
    width: int = Field(8, ge=1, le=64, description="tinyconv: channels of its hidden convolutions")
    pools_the_image: ClassVar[bool] = False
