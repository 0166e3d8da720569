#!/usr/bin/env bash
# The checks a session runs first when a GPU machine is lent to it (CI never has one), capped so that
# a lent quarter hour yields names, not a killed run:
#
#   bash tools/gpu_check.sh OUT_DIR [--dry] [SECTION ...]
#
# Default sections, in order, within CAP_S (240 s of a warm machine, about 4 minutes):
#   env    the card, driver, torch and Python (env.txt)
#   tests  the CUDA-marked tests (`-m "cuda or cuda2"`), the fastest decisive files first, spread
#          test by test over the workers, each test under a per-test timeout and the whole under a
#          session timeout (pytest-timeout), so pytest ends by itself and writes its junit report
#          (junit.xml) with every test it reached; cuda-tests.txt lists every collected one
#   plan   segadv-plan --measure of the DINOv2-B mean teacher (mean_teacher_dinov2_voc) against
#          torch.cuda.max_memory_allocated (plan.json)
#   bench  tools/bench.py at the demo's size and at VOC's (bench-demo.log, bench-voc.log)
# then summary.md (tools/gpu_check_summary.py): each section's exit and time, every CUDA test by
# outcome with each failure, time-out and test not reached named, the plan against the allocator,
# the bench ratios. Other sections, by name, for a session with time to spare: compile-ro (bench
# with compile.mode=reduce-overhead), plan-split (G on the GPU, D on the host), cli (short CLI runs
# on CUDA), suite (the whole suite on the machine).
#
# --dry runs the same steps on the CPU (the tests are collected and skipped for want of a GPU, the
# plan and the bench on small networks): CI runs it (tests/tools/test_gpu_check.py).
#
# The lent machine has torch but not smp/albumentations: carry the wheels that
# ../shared/tools/gpu-wheels.sh puts into .whl/ (this script installs them when .whl/ exists).
set -uo pipefail
out=${1:?usage: gpu_check.sh OUT_DIR [--dry] [SECTION ...]}
shift
dry=false
if [ "${1:-}" = "--dry" ]; then
  dry=true
  shift
fi
sections=${*:-env tests plan bench}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
CAP_S=240
TEST_TIMEOUT_S=90      # one CUDA test (an inductor compile on the GPU takes tens of seconds)
TESTS_SESSION_S=120    # the CUDA tests together; then pytest stops and reports what ran
start=$SECONDS

if [ -d .whl ] && ! "$PY" -c "import segmentation_models_pytorch" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  mkdir -p /tmp/site/bin
  # The console scripts (segadv-train, segadv-plan, ...) as tiny wrappers over the modules.
  for pair in train:segadv.cli.train eval:segadv.cli.eval export:segadv.cli.export predict:segadv.cli.predict \
              data:segadv.cli.data ckpt:segadv.cli.ckpt plan:segadv.cli.plan; do
    printf '#!/bin/sh\nexec %s -c "import sys, %s as m; sys.argv[0]=\\"segadv-%s\\"; sys.exit(m.main())" "$@"\n' \
      "$PY" "${pair#*:}" "${pair%%:*}" > "/tmp/site/bin/segadv-${pair%%:*}"
    chmod +x "/tmp/site/bin/segadv-${pair%%:*}"
  done
  export PATH=/tmp/site/bin:$PATH
fi

if $dry; then
  G=g:cpu,d:cpu
  workers=2
  # The demo's and VOC's networks at a size two CPU cores run in seconds; the plan on dinov2_tiny.
  BENCH_ARGS="--steps 1 --rounds 1 --warmup 0 --no-variants"
  DEMO_SIZE="data.synthetic.image_size=64 data.batch_size=2"
  VOC_SIZE="data.synthetic.image_size=64 data.batch_size=2"
  PLAN_ARGS="--config dinov2_tiny method.name=mean_teacher --device-map cpu --steps 1"
else
  G=g:cuda:0,d:cuda:0
  workers=8
  BENCH_ARGS="--no-variants"
  DEMO_SIZE=""
  VOC_SIZE="data.synthetic.image_size=320 data.batch_size=10"
  PLAN_ARGS="--config mean_teacher_dinov2_voc model.generator.encoder=vit_base_patch14_dinov2 --device-map g:0,d:0,t:0"
fi
VOC_NETS="model.generator.encoder=resnet101 model.generator.encoder_weights=null model.generator.encoder_depth=5
  model.generator.output_stride=16 model.generator.decoder_channels=256 model.discriminator.ndf=64 train.channels_last=false"

printf 'section\texit\tseconds\tcap\n' > "$out/sections.tsv"
section() {  # name, cap in seconds, command...: its log in OUT/name.log, its exit in sections.tsv
  local name=$1 cap=$2
  shift 2
  local left=$((CAP_S - (SECONDS - start)))
  if [ "$left" -lt 5 ]; then
    printf '%s\tnot run\t0\t%s\n' "$name" "$cap" >> "$out/sections.tsv"
    echo "=== $name: not run (the ${CAP_S} s cap is spent)"
    return
  fi
  [ "$cap" -gt "$left" ] && cap=$left
  local t0=$SECONDS
  echo "=== $name (cap ${cap}s)"
  timeout -k 5 "$cap" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$cap" >> "$out/sections.tsv"
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
  tail -n 8 "$out/$name.log"
}

want() { [[ " $sections " == *" $1 "* ]]; }
# the sections run their functions in a child shell under timeout
export out dry PY workers G BENCH_ARGS DEMO_SIZE VOC_SIZE VOC_NETS PLAN_ARGS TEST_TIMEOUT_S TESTS_SESSION_S

environment() {
  if command -v nvidia-smi > /dev/null && ! $dry; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  fi
  "$PY" -c "import sys, torch; print('torch', torch.__version__, 'python', sys.version.split()[0], 'cuda devices',
torch.cuda.device_count(), *(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))"
}

# Placement, host syncs, resume, prediction and the methods' GPU cases first (a few seconds each and
# each decisive on its own), then the equivalence harness, its basic placements before the rest.
TEST_ORDER="tests/parallel tests/engine tests/integration/test_resume.py tests/export tests/methods tests/models
  tests/monitor tests/plan tests/integration/test_equivalence.py tests/integration/test_equivalence_unimatch.py tests"
cuda_tests() {
  "$PY" -m pytest --collect-only -q -p no:cacheprovider -m "cuda or cuda2" $TEST_ORDER \
    | grep '::' > "$out/cuda-tests.txt"
  echo "collected $(wc -l < "$out/cuda-tests.txt") CUDA tests"
  "$PY" -m pytest -q -rfEs -p no:cacheprovider -n "$workers" --dist load -m "cuda or cuda2" \
    --timeout "$TEST_TIMEOUT_S" --session-timeout "$TESTS_SESSION_S" --junitxml "$out/junit.xml" $TEST_ORDER
}

bench_both() {
  echo "--- demo"
  "$PY" tools/bench.py --device-map "$G" $BENCH_ARGS $DEMO_SIZE > "$out/bench-demo.log" 2>&1
  local rc=$?
  cat "$out/bench-demo.log"
  echo "--- voc"
  "$PY" tools/bench.py --device-map "$G" $BENCH_ARGS $VOC_NETS $VOC_SIZE > "$out/bench-voc.log" 2>&1 || rc=$?
  cat "$out/bench-voc.log"
  return $rc
}

export TEST_ORDER
export -f environment cuda_tests bench_both

want env && section env 15 bash -c environment
if want tests; then
  # the session timeout ends pytest first; this cap covers collection and the workers' start
  section tests $((TESTS_SESSION_S + 30)) bash -c cuda_tests
fi
if want plan; then
  # plan.json: the plan beside the measured run (measured_peak_bytes: its tensors; allocator_peak_bytes:
  # torch.cuda.max_memory_allocated on a GPU)
  section plan 45 bash -c 'segadv-plan $PLAN_ARGS --measure --json > "$out/plan.json"'
fi
want bench && section bench 40 bash -c bench_both

# Beyond the four minutes: by name only.
want compile-ro && section compile-ro 150 "$PY" tools/bench.py --device-map "$G" --no-variants --compile compile.mode=reduce-overhead
want plan-split && section plan-split 90 segadv-plan --config default --device-map g:0,d:cpu --measure
if want cli; then
  cli_all() {
    local tiny="model.generator.encoder=mobilenet_v2 model.generator.encoder_depth=4 model.generator.output_stride=16
      model.generator.decoder_channels=64 model.discriminator.ndf=8 data.synthetic.image_size=64
      data.synthetic.train_size=16 data.synthetic.val_size=8 data.batch_size=2 data.val_batch_size=4
      data.num_workers=0 train.log_every=2 train.eval_every=4 checkpoint.every=4 log.progress_bar=false
      train.deterministic=true"
    local r=/tmp/gpu_cli
    rm -rf $r
    segadv-train --device-map g:0,d:0 --run-dir $r/full $tiny train.max_steps=4 > $r.full.log 2>&1 || echo "full exit $?"
    segadv-train --nproc-per-node 1 --device-map g:0,d:0 --run-dir $r/torchrun $tiny train.max_steps=4 \
      > $r.torchrun.log 2>&1 || echo "torchrun exit $?"
    segadv-train --device-map g:0,d:0 --run-dir $r/amp $tiny train.max_steps=4 amp.generator.enabled=true \
      amp.discriminator.enabled=true amp.discriminator.dtype=float16 > $r.amp.log 2>&1 || echo "amp exit $?"
    "$PY" -c "from PIL import Image; import numpy as np; Image.fromarray((np.random.rand(96,128,3)*255).astype('uint8')).save('/tmp/gpu_cli/img.png')"
    segadv-predict --checkpoint $r/full/checkpoints/last.pt --input $r/img.png --output $r/pred --device cuda \
      || echo "predict exit $?"
    for f in $r.*.log; do echo "$f: $(grep -c Traceback $f) tracebacks; $(grep 'done:' $f | tail -1)"; done
  }
  export -f cli_all
  section cli 180 bash -c cli_all
fi
want suite && section suite 400 "$PY" -m pytest -q -x -p no:cacheprovider -n 12 tests

"$PY" tools/gpu_check_summary.py "$out" $($dry && echo --dry) > "$out/summary.md"
rc=$?
cat "$out/summary.md"
echo "total $((SECONDS - start)) s (cap ${CAP_S} s for the default sections)"
exit $rc
