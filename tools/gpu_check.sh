#!/usr/bin/env bash
# The checks a session runs when a GPU machine is lent to it (CI never has one): the CUDA-marked
# tests, tools/bench.py on CUDA, segadv-plan's prediction against torch.cuda.max_memory_allocated
# (--measure) for the shipped configs, and short CLI runs on CUDA (train, resume, DDP over NCCL,
# predict --device cuda). Every section is timed and capped; the logs go to OUT_DIR.
#
#   bash tools/gpu_check.sh OUT_DIR [SECTION ...]
#
# sections: env tests bench (the demo's size, with a profile of both sides) bench-voc (VOC's networks
# and crop on synthetic data) compile-ro (compile.mode=reduce-overhead) plan plan-split cli suite
#
# The lent machine has torch but not smp/albumentations: carry the wheels that
# ../shared/tools/gpu-wheels.sh puts into .whl/ (this script installs them when .whl/ exists).
set -uo pipefail
out=${1:?usage: gpu_check.sh OUT_DIR [SECTION ...]}
shift
sections=${*:-env tests bench plan cli}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

if [ -d .whl ] && ! python3 -c "import segmentation_models_pytorch" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  mkdir -p /tmp/site/bin
  # The console scripts (segadv-train, segadv-plan, ...) as tiny wrappers over the modules.
  for pair in train:segadv.cli.train eval:segadv.cli.eval export:segadv.cli.export predict:segadv.cli.predict \
              data:segadv.cli.data ckpt:segadv.cli.ckpt plan:segadv.cli.plan; do
    printf '#!/bin/sh\nexec python3 -c "import sys, %s as m; sys.argv[0]=\\"segadv-%s\\"; sys.exit(m.main())" "$@"\n' \
      "${pair#*:}" "${pair%%:*}" > "/tmp/site/bin/segadv-${pair%%:*}"
    chmod +x "/tmp/site/bin/segadv-${pair%%:*}"
  done
  export PATH=/tmp/site/bin:$PATH
fi

section() {  # name, cap in seconds, command...
  local name=$1 cap=$2
  shift 2
  local t0=$SECONDS
  echo "=== $name (cap ${cap}s)"
  timeout "$cap" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
  tail -n 25 "$out/$name.log"
}

want() { [[ " $sections " == *" $1 "* ]]; }

if want env; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0), torch.cuda.device_count(), 'GPU(s)')"
fi

if want tests; then
  section tests 150 python3 -m pytest -q -rs -p no:cacheprovider -n 4 --dist loadfile -m "cuda or cuda2" tests
fi

if want bench; then
  section bench 120 python3 tools/bench.py --device-map g:cuda:0,d:cuda:0 --profile 8
fi

VOC_BENCH="model.generator.encoder=resnet101 model.generator.encoder_weights=null model.generator.encoder_depth=5
  model.generator.output_stride=16 model.generator.decoder_channels=256 model.discriminator.ndf=64
  data.synthetic.image_size=320 data.batch_size=10 train.channels_last=false"
if want bench-voc; then
  section bench-voc 120 python3 tools/bench.py --device-map g:cuda:0,d:cuda:0 --no-variants --profile 4 $VOC_BENCH
fi

if want compile-ro; then
  section compile-ro 150 python3 tools/bench.py --device-map g:cuda:0,d:cuda:0 --no-variants --compile compile.mode=reduce-overhead
fi

if want plan; then
  plan_all() {
    for args in "default" "semi" "uda" "voc" "mean_teacher_voc" "default amp.generator.enabled=false amp.discriminator.enabled=false"; do
      set -- $args
      echo "--- $* g:0,d:0"
      segadv-plan --config "$@" --device-map g:0,d:0 --measure || echo "exit $?"
    done
    echo "--- default g:0,d:cpu"
    segadv-plan --config default --device-map g:0,d:cpu --measure || echo "exit $?"
  }
  export -f plan_all
  section plan 120 bash -c plan_all
fi

if want plan-split; then  # G on the GPU, D on the host: the hand-over between devices
  section plan-split 90 segadv-plan --config default --device-map g:0,d:cpu --measure
fi

if want cli; then
  cli_all() {
    local tiny="model.generator.encoder=mobilenet_v2 model.generator.encoder_depth=4 model.generator.output_stride=16
      model.generator.decoder_channels=64 model.discriminator.ndf=8 data.synthetic.image_size=64
      data.synthetic.train_size=16 data.synthetic.val_size=8 data.batch_size=2 data.val_batch_size=4
      data.num_workers=0 train.log_every=2 train.eval_every=4 checkpoint.every=4 log.progress_bar=false
      train.deterministic=true"
    local r=/tmp/gpu_cli
    rm -rf $r
    # (exact resume on CUDA is tests/integration/test_resume.py's cuda test)
    segadv-train --device-map g:0,d:0 --run-dir $r/full $tiny train.max_steps=4 > $r.full.log 2>&1 || echo "full exit $?"
    segadv-train --nproc-per-node 1 --device-map g:0,d:0 --run-dir $r/torchrun $tiny train.max_steps=4 \
      > $r.torchrun.log 2>&1 || echo "torchrun exit $?"
    segadv-train --device-map g:0,d:0 --run-dir $r/amp $tiny train.max_steps=4 amp.generator.enabled=true \
      amp.discriminator.enabled=true amp.discriminator.dtype=float16 > $r.amp.log 2>&1 || echo "amp exit $?"
    grep -E "done:|scaler" $r.amp.log | head -4
    python3 -c "from PIL import Image; import numpy as np; Image.fromarray((np.random.rand(96,128,3)*255).astype('uint8')).save('/tmp/gpu_cli/img.png')"
    segadv-predict --checkpoint $r/full/checkpoints/last.pt --input $r/img.png --output $r/pred --device cuda \
      || echo "predict exit $?"
    ls $r/pred
    for f in $r.*.log; do echo "$f: $(grep -c Traceback $f) tracebacks; $(grep 'done:' $f | tail -1)"; done
  }
  export -f cli_all
  section cli 180 bash -c cli_all
fi

if want suite; then
  section suite 400 python3 -m pytest -q -x -p no:cacheprovider -n 12 tests
fi
