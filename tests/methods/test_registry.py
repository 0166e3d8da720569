"""A method declares itself: a method defined here, in this file alone (its declaration, its setup,
its config section and its iteration, linked by name), registers in one line, is built from its
setup and trains through segadv-train's entry point; the registry refuses a class that leaves a
declaration out; a misspelt iteration link is an error naming it; the built-ins declare what the
run asks of them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Mapping, Optional

import pytest
import torch
import torch.nn.functional as F
import yaml
from pydantic import Field

from segadv.config import load_config
from segadv.config.schema import Section
from segadv.data.streams import StreamSpec
from segadv.engine.losses import one_hot_labels
from segadv.errors import UserError
from segadv.methods import Method, method_class, register_method
from segadv.methods import registry
from segadv.methods.base import Setup
from segadv.methods.mean_teacher.declaration import MeanTeacherSetup, MeanTeacherSpec
from segadv.methods.adversarial import (
    GROUND_TRUTH_REAL,
    DiscriminatorBatch,
    copy_in,
    discriminator_backward,
    generator_logits,
    hand_over,
    optimizer_step,
)
from segadv.methods.schedule import Schedule
from segadv.monitor.profile import PhaseTimer
from segadv.cli.train import main as train_main

from conftest import TINY_OVERRIDES


class ToyConfig(Section):
    entropy_weight: float = Field(0.1, ge=0)
    entropy_start: int = Field(1, ge=0)
    extra_batch_size: Optional[int] = Field(None, gt=0)  # None: data.batch_size


@dataclass(frozen=True)
class ToySetup(Setup):
    settings: ToyConfig  # method.toy
    seed: int  # train.seed: read by nothing but the test of the setup


class Toy(Method):
    """The declaration: CE on the labeled stream plus the mean entropy of G on a second labeled
    stream (from ``entropy_start``); D learns one-hot labels from G's maps, and nothing of D
    reaches G."""

    name = "toy"
    iteration_path = f"{__name__}:ToyIteration"
    config = ToyConfig
    streams = (StreamSpec("labeled", "labeled"),
               StreamSpec("extra", "labeled", seed_word=7, batch_size_key="method.toy.extra_batch_size"))
    seen: list[tuple[int, ...]] = []  # the extra stream's batch shapes, as drawn

    @classmethod
    def setup(cls, cfg) -> ToySetup:
        return ToySetup(**vars(super().setup(cfg)), settings=cls.settings(cfg), seed=cfg.train.seed)

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg) -> bool:
        return False


class ToyIteration(Toy):
    """The iteration, built from the declaration's setup."""

    def __init__(self, setup: ToySetup, nets: Mapping, phases) -> None:
        self.g, self.d, self.phases = nets["generator"], nets["discriminator"], phases
        self.setup_seen = setup
        self.settings = setup.settings
        self.num_classes, self.ignore_index = setup.num_classes, setup.ignore_index
        self.schedule = Schedule(entropy=(setup.settings.entropy_weight, setup.settings.entropy_start))

    def __call__(self, streams: Mapping, step: int) -> dict[str, torch.Tensor]:
        g, d = self.g, self.d
        images, labels = streams["labeled"].next()
        extra, _ = streams["extra"].next()
        Toy.seen.append(tuple(extra.shape))
        images, labels, extra = copy_in(self.phases, g.device, images, labels, extra)
        g.module.train()
        d.module.train()
        with self.phases.phase("g_fwd_bwd", g.device):
            logits = generator_logits(g, images)
            loss_seg = F.cross_entropy(logits, labels, ignore_index=self.ignore_index)
            g.opt.backward(loss_seg)
            probs = generator_logits(g, extra).softmax(dim=1)
            loss_ent = -(probs * probs.clamp_min(1e-12).log()).sum(dim=1).mean()
            if self.schedule.active("entropy", step):
                g.opt.backward(self.settings.entropy_weight * loss_ent)
        optimizer_step(self.phases, g)
        fake = hand_over(self.phases, logits.softmax(dim=1).detach(), g, d)
        (labels_d,) = copy_in(self.phases, d.device, labels)
        valid = labels_d != self.ignore_index
        real = one_hot_labels(labels_d, self.num_classes, valid)
        loss_d, _ = discriminator_backward(self.phases, d, [DiscriminatorBatch(fake, GROUND_TRUTH_REAL.fake, valid),
                                                            DiscriminatorBatch(real, GROUND_TRUTH_REAL.real, valid)])
        optimizer_step(self.phases, d)
        return {"loss_seg": loss_seg.detach(), "loss_ent": loss_ent.detach(), "loss_d": loss_d}


@pytest.fixture
def toy(monkeypatch):
    """Toy registered for this test only (a plugin would call register_method at its import)."""
    monkeypatch.setattr(registry, "METHODS", dict(registry.METHODS))
    monkeypatch.setattr(Toy, "seen", [])
    return register_method(Toy)


def test_a_method_defined_outside_the_package_trains_through_segadv_train(toy, tmp_path):
    run = tmp_path / "run"
    code = train_main(["--run-dir", str(run), "--device-map", "cpu", *TINY_OVERRIDES, "train.log_every=1",
                       "method.name=toy", "method.toy.extra_batch_size=3", "method.toy.entropy_weight=0.5"])
    assert code == 0
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "train/loss_ent" in r] == [1, 2, 3, 4]
    assert all({"train/loss_seg", "train/loss_d"} <= set(r) for r in logged if "train/loss_ent" in r)
    assert Toy.seen == [(3, 3, 64, 64)] * 4  # the extra stream at its own batch size
    saved = yaml.safe_load((run / "config.yaml").read_text())["method"]
    assert saved["name"] == "toy"
    assert saved["toy"] == {"entropy_weight": 0.5, "entropy_start": 1, "extra_batch_size": 3}
    assert "advsemiseg" in saved  # the built-ins' sections stay


def test_its_section_is_validated_as_a_built_in_section_is(toy, tmp_path, capsys):
    with pytest.raises(UserError, match=r"method\.toy\.entropy_wieght: unknown key; did you mean "
                                        r"'method\.toy\.entropy_weight'\?"):
        load_config(None, ["method.name=toy", "method.toy.entropy_wieght=1"])
    with pytest.raises(UserError, match=r"method\.toy\.extra_batch_size: must be greater than 0"):
        load_config(None, ["method.name=toy", "method.toy.extra_batch_size=0"])
    code = train_main(["--run-dir", str(tmp_path / "run"), *TINY_OVERRIDES, "method.name=toy",
                       "method.toy.entropy_start=-1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "method.toy.entropy_start" in err and "Traceback" not in err
    # A batch size that no split fits names the method's own key.
    assert train_main(["--run-dir", str(tmp_path / "big"), *TINY_OVERRIDES, "method.name=toy",
                       "method.toy.extra_batch_size=99"]) == 2
    assert "method.toy.extra_batch_size: 99 is larger than the extra set" in capsys.readouterr().err


def test_an_unregistered_name_lists_the_registered_ones(toy):
    with pytest.raises(UserError, match=r"method\.name: expected 'supervised', .*'minent', 'mean_teacher', 'unimatch' or 'toy', got str 'toyy'"):
        load_config(None, ["method.name=toyy"])
    with pytest.raises(KeyError, match="unknown method 'toyy'; methods: supervised, .*, toy"):
        method_class("toyy")


def test_a_method_defined_here_is_built_from_its_setup(toy):
    """build.py's one call, ``from_config``: the declaration resolves its setup from the config
    once, and the class its link names is built from it."""
    cfg = load_config(None, ["method.name=toy", "method.toy.entropy_weight=0.5", "method.toy.entropy_start=3",
                             "data.num_classes=5", "train.seed=11"])
    assert Toy.iteration_class() is ToyIteration
    nets = {"generator": object(), "discriminator": object()}
    method = method_class("toy").from_config(cfg, nets, PhaseTimer())
    assert type(method) is ToyIteration and (method.g, method.d) == (nets["generator"], nets["discriminator"])
    assert method.setup_seen == ToySetup(num_classes=5, ignore_index=cfg.data.ignore_index, lambda_adv=0.0,
                                         settings=cfg.method.toy, seed=11)
    assert method.settings.entropy_weight == 0.5 and method.schedule.terms["entropy"].weight == 0.5
    assert not method.schedule.active("entropy", 2) and method.schedule.active("entropy", 3)


def test_a_built_ins_setup_comes_from_the_config():
    cfg = load_config(None, ["method.name=mean_teacher", "loss.lambda_adv=0.02", "train.seed=9",
                             "method.mean_teacher.ema_decay=0.9", "data.num_classes=4"])
    setup = MeanTeacherSpec.setup(cfg)
    assert setup == MeanTeacherSetup(
        num_classes=4, ignore_index=cfg.data.ignore_index, lambda_adv=0.02, settings=cfg.method.mean_teacher,
        adapts=False, mean=cfg.data.input_normalization.mean, std=cfg.data.input_normalization.std, seed=9,
        aux_head=False)
    assert setup.settings.ema_decay == 0.9
    with pytest.raises(Exception, match="frozen|cannot assign"):
        setup.seed = 1  # resolved once: the iteration cannot change what the config said


@pytest.mark.parametrize("misspell, says", [
    (lambda link: link.replace(".iteration:", ".iteratoin:"), r"no module segadv\.methods\.mean_teacher\.iteratoin"),
    (lambda link: link.replace(":MeanTeacher", ":MeanTeachr"), r"mean_teacher\.iteration defines no MeanTeachr"),
    (lambda link: link.replace("mean_teacher.iteration:MeanTeacher", "s4gan.iteration:S4Gan"),
     r"S4Gan is not a subclass of MeanTeacherSpec"),
])
def test_a_misspelt_iteration_link_is_an_error_naming_it(monkeypatch, misspell, says):
    link = misspell(MeanTeacherSpec.iteration_path)
    monkeypatch.setattr(MeanTeacherSpec, "iteration_path", link)
    cfg = load_config(None, ["method.name=mean_teacher"])
    with pytest.raises(TypeError, match=rf"method mean_teacher: its iteration '{re.escape(link)}' .*: .*{says}"):
        MeanTeacherSpec.from_config(cfg, {}, PhaseTimer())


def test_a_link_not_written_module_colon_class_is_refused_at_registration(toy):
    class Dotted(Toy):
        name = "dotted"
        iteration_path = f"{__name__}.ToyIteration"

    with pytest.raises(TypeError, match=r"method dotted: iteration_path must name its class as 'dotted.module:Class'"):
        register_method(Dotted)
    assert "dotted" not in registry.METHODS


def test_registration_refuses_an_incomplete_declaration(toy):
    class NoDiscriminatorAnswer(Method):
        name = "no_answer"
        streams = (StreamSpec("labeled", "labeled"),)

        @classmethod
        def from_config(cls, cfg, nets, phases):
            raise AssertionError

        def __call__(self, streams, step):
            raise AssertionError

    with pytest.raises(TypeError, match="leaves abstract: passes_generator_loss_through_discriminator"):
        register_method(NoDiscriminatorAnswer)

    class WrongKey(Toy):
        name = "wrong_key"
        streams = (StreamSpec("extra", "labeled", batch_size_key="method.<name>.extra_batch_size"),)

    with pytest.raises(TypeError, match="neither data.batch_size nor a setting of method.wrong_key"):
        register_method(WrongKey)

    class Impostor(Toy):
        pass

    with pytest.raises(ValueError, match="'toy' is already registered"):
        register_method(Impostor)
    assert "no_answer" not in registry.METHODS and "wrong_key" not in registry.METHODS


def test_another_methods_section_is_kept_when_name_switches_methods():
    """An experiment grid's row switches with method.name over a config that sets another's section."""
    cfg = load_config("semi", ["method.name=supervised"])
    assert (cfg.method.name, cfg.method.advsemiseg.lambda_semi) == ("supervised", 1.0)
    assert method_class("supervised").stream_batch_sizes(cfg) == {"labeled": cfg.data.batch_size}


@pytest.mark.parametrize("overrides, passes", [
    (["method.name=supervised"], True),
    (["method.name=supervised", "loss.lambda_adv=0"], False),
    (["method.name=advsemiseg", "loss.lambda_adv=0"], True),
    (["method.name=advsemiseg", "loss.lambda_adv=0", "method.advsemiseg.lambda_semi_adv=0"], False),
    (["method.name=s4gan"], True),
    (["method.name=s4gan", "method.s4gan.lambda_fm=0"], False),
    (["method.name=adaptsegnet", "loss.lambda_adv=0"], False),
    (["method.name=adaptsegnet", "loss.lambda_adv=0", "model.generator.aux_head=true"], True),
    (["method.name=advent"], True),
    (["method.name=minent", "loss.lambda_adv=0"], False),
    (["method.name=mean_teacher"], False),
    (["method.name=mean_teacher", "loss.lambda_adv=0.01"], True),
])
def test_built_ins_say_whether_gs_loss_passes_through_a_d(overrides, passes):
    cfg = load_config(None, overrides)
    assert method_class(cfg.method.name).passes_generator_loss_through_discriminator(cfg) is passes


def test_built_in_streams_name_their_own_batch_size_keys():
    cfg = load_config(None, ["method.advent.target_batch_size=5", "method.advsemiseg.unlabeled_batch_size=3"])
    keys = {name: {s.name: s.batch_size_key for s in cls.streams} for name, cls in registry.METHODS.items()}
    assert keys["advent"]["target"] == "method.advent.target_batch_size"
    assert keys["minent"]["target"] == "method.minent.target_batch_size"
    assert keys["advsemiseg"]["unlabeled"] == "method.advsemiseg.unlabeled_batch_size"
    assert method_class("advent").stream_batch_sizes(cfg) == {"source": cfg.data.batch_size, "target": 5}
    assert method_class("adaptsegnet").stream_batch_sizes(cfg)["target"] == cfg.data.batch_size
    assert method_class("advsemiseg").stream_batch_sizes(cfg)["unlabeled"] == 3


@pytest.mark.parametrize("name", ["supervised", "advsemiseg", "s4gan", "adaptsegnet", "advent", "minent",
                                  "mean_teacher"])
def test_a_built_ins_iteration_is_its_declaration_with_a_call(name):
    declaration = method_class(name)
    iteration = declaration.iteration_class()
    module, _, class_name = declaration.iteration_path.partition(":")  # the link names it, in its own folder
    assert (iteration.__module__, iteration.__name__) == (module, class_name)
    assert module == declaration.__module__.replace(".declaration", ".iteration")
    assert issubclass(iteration, declaration) and iteration.name == name
    assert any("__call__" in vars(c) for c in iteration.__mro__[:-1])  # it runs one
    assert iteration.streams == declaration.streams and iteration.iteration_class() is iteration


def test_the_built_ins_declare_what_they_log():
    """Each built-in names its losses, D's among them, those over a selection of pixels (each with
    its train/empty/<loss>), and the diagnostics a grid's table reports: the loop's "D wins" watch
    and segadv-experiment read them from the class."""
    for cls in registry.METHODS.values():
        assert set(cls.d_losses) <= set(cls.losses)
        assert "loss_seg" in cls.selection_losses and set(cls.selection_losses) <= set(cls.losses)
        assert all(tag.partition("/")[0] in ("train", "diag") for tag in cls.diagnostics)
        assert {tag.partition("/")[2] for tag in cls.diagnostics if tag.startswith("train/")} <= set(cls.losses)
    assert method_class("minent").d_losses == () and method_class("advent").d_losses == ("loss_d", "loss_d_aux")


def test_a_method_declares_the_networks_it_trains():
    cfg = load_config(None, ["model.generator.aux_head=true", "method.name=minent"])
    assert method_class("minent").networks(cfg) == ("generator",)
    assert method_class("advent").networks(cfg) == ("generator", "discriminator", "discriminator_aux")
    assert method_class("supervised").networks(load_config(None, [])) == ("generator", "discriminator")
