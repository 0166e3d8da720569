import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

TOOLS = Path(__file__).resolve().parents[1] / "tools"


# What `make test-fast` leaves out (`-m "not slow"`): multi-process runs, whole CLI trainings, the
# wheel build, the full equivalence harness and the planner's per-config matrix. `make test` runs all.
SLOW = ("integration/", "parallel/test_distributed.py", "parallel/test_cluster.py", "plan/test_plan",
        "experiment/test_cli.py", "tools/test_bench.py")


def pytest_collection_modifyitems(config, items):
    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        if str(Path(item.fspath).resolve().relative_to(tests_dir)).startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if "cuda" in item.keywords and cuda_count < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if "cuda2" in item.keywords and cuda_count < 2:
            item.add_marker(pytest.mark.skip(reason="needs two CUDA devices"))


# Features that need a newer torch than the floor (segadv/versions.py): below it they exit 2
# (tests/test_versions.py, tests/plan/test_torch_surfaces.py) and their tests are skipped.
def _needs_torch_for(feature: str):
    from segadv.versions import TORCH_NEEDED, torch_supports

    (major, minor), _ = TORCH_NEEDED[feature]
    return pytest.mark.skipif(not torch_supports(feature), reason=f"{feature} needs torch {major}.{minor} or newer")


needs_planner_torch = _needs_torch_for("segadv-plan")
needs_compiled_checkpointing_torch = _needs_torch_for(
    "compile.generator=true with model.generator.activation_checkpointing=true")

# A few-second configuration: small images, a small encoder, a narrow D, few samples. G's
# geometry and memory format are pinned so that retuning the demo (configs/default.yaml) never
# moves the tests.
TINY_OVERRIDES = [
    "model.generator.encoder=mobilenet_v2",
    "model.generator.encoder_depth=4",
    "model.generator.output_stride=16",
    "model.generator.decoder_channels=64",
    "train.channels_last=false",
    "model.discriminator.ndf=8",
    "data.synthetic.image_size=64",
    "data.synthetic.train_size=16",
    "data.synthetic.val_size=8",
    "data.batch_size=2",
    "data.val_batch_size=4",
    "data.num_workers=0",
    "train.max_steps=4",
    "train.log_every=2",
    "train.eval_every=2",
    "checkpoint.every=2",
    "log.progress_bar=false",
    "log.num_images=2",
    "loss.adv_warmup_steps=0",
    # float32 whatever the machine: the demo's amp auto would pick bf16 on a CPU with native bf16.
    "amp.generator.enabled=false",
    "amp.discriminator.enabled=false",
]


@pytest.fixture(autouse=True, scope="session")
def mask_survey_cache(tmp_path_factory):
    """The training start's mask survey caches what it read (segadv/data/mask_survey.py): in the
    session's temp folder, never the user's ~/.cache (child processes inherit the variable)."""
    os.environ["SEGADV_CACHE_DIR"] = str(tmp_path_factory.mktemp("segadv-cache"))


@pytest.fixture
def tiny_cfg(tmp_path):
    from segadv.config import load_config

    cfg = load_config(None, TINY_OVERRIDES)
    cfg.run_dir = str(tmp_path / "run")
    cfg.device_map = "g:cpu,d:cpu"
    return cfg


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module (opt in with pytest.mark.usefixtures): on a loaded shared
    CPU, spinning OpenMP threads make tiny convolutions tens of times slower. The export's own
    onnxruntime check follows torch's setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def load_tool(name: str):
    """tools/<name>.py as a module (tools/ is scripts, not a package). Registered in sys.modules
    before it runs: dataclasses look their module up there."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def no_tf32():
    """float32 on CUDA compared as float32: TF32 convolutions and matmuls off for the test."""
    if not torch.cuda.is_available():
        yield
        return
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture
def logits_at_calls(monkeypatch):
    """Every (input size, output size) evaluation asks G for (segadv.engine.evaluate's logits_at)."""
    import segadv.engine.evaluate as evaluate_module

    calls = []
    real = evaluate_module.logits_at

    def spy(model, network, x, size):
        calls.append((tuple(x.shape[-2:]), tuple(int(n) for n in size)))
        return real(model, network, x, size)

    monkeypatch.setattr(evaluate_module, "logits_at", spy)
    return calls
