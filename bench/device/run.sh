#!/bin/bash
# bench/device/run.sh [STEPS]: on a lent machine (bench/device/site.sh packed what it needs), the
# CPU benchmarks of issue T, each step capped to what is left of BUDGET seconds. Steps:
# runtimes16 (bench.runtimes on every core), runtimes2 (pinned to two physical cores with
# taskset, the load generator too), graphs2 (the same, the graph alone), streams16
# (bench.streams on every core), workers16 (bench.workers: one process against one per 4 CPUs,
# on every core). Logs to $OUT/log.txt, results under $OUT/<step>/.
START=$(date +%s); BUDGET=${BUDGET:-540}; PY=${PY:-python3}; SITE=${SITE:-.devbench/site.tar.xz}
left() { echo $((BUDGET - ($(date +%s) - START))); }
exec > >(tee -a "$OUT/log.txt") 2>&1
mkdir -p /tmp/site
$PY -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('/tmp/site')" "$SITE" || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HEADWISE_ATTENTION_ENABLED=false HEADWISE_DEVICE=cpu
echo "== machine"; nproc; free -g | head -2
lscpu | grep -E 'Model name|Socket|Core|Thread|NUMA node|Flags'
$PY -m bench.device.pack --unpack .devbench/pack bundles/dev || exit 1
$PY -c "import openvino as ov; print('openvino', ov.get_version(), ov.Core().get_property('CPU', 'OPTIMIZATION_CAPABILITIES'))"
PAIR=$(lscpu -p=CPU,CORE | grep -v '^#' | awk -F, '!seen[$2]++ {print $1}' | head -2 | paste -sd,)
step() {  # step NAME CAP CMD...: skipped under a minute left, capped to what is left
  local name=$1 cap=$2 t; shift 2; t=$(left)
  ((t < 60)) && { echo "== $name skipped: $t s left"; return; }
  ((cap > t - 10)) && cap=$((t - 10))
  echo "== $name (cap $cap s) at $(($(date +%s) - START)) s"
  timeout -k 5 "$cap" "$@"; echo "== $name rc $? at $(($(date +%s) - START)) s"
}
for s in ${*:-runtimes16 graphs2 streams16}; do
  case $s in
    runtimes16) step $s 260 $PY -m bench.runtimes --bundle bundles/dev --pairs 500 --out "$OUT/$s" ;;
    runtimes2) step $s 420 taskset -c "$PAIR" $PY -m bench.runtimes --bundle bundles/dev --pairs 300 --out "$OUT/$s" ;;
    graphs2) step $s 150 taskset -c "$PAIR" $PY -m bench.runtimes --bundle bundles/dev --pairs 300 --no-http --out "$OUT/$s" ;;
    streams16) step $s 200 $PY -m bench.streams --bundle bundles/dev --rounds 3 --http-rounds 4 --out "$OUT/$s" ;;
    workers16) step $s 240 $PY -m bench.workers --bundle bundles/dev --workers $(($(nproc) / 4)) --rounds 3 --out "$OUT/$s" ;;
    *) echo "unknown step $s" ;;
  esac
done
echo "== done at $(($(date +%s) - START)) s"
