#!/usr/bin/env bash
# Every extraction precision this CPU runs, measured the way docs/performance.md ("Which
# precision is the default") judges them: speed at each kernel level from avx512 up (bench
# extract, onnxruntime in the same run), tokens against onnxruntime's f32 (the model's parity
# test), and retrieval against f32 on both real benchmarks (the shipped recipe must stay
# within 0.005 mAP). Written for the measurements issue 28 still lacks on an Intel Xeon with
# AMX (levels amx and avx512 side by side); it runs on any CPU.
# Usage: scripts/precision_check.sh MARS_MANIFEST NAC_MANIFEST OUT_DIR [GALLERY_DIR]
#   MARS_MANIFEST, NAC_MANIFEST: the benchmarks' splits/test.json (docs/results.md builds them)
#   GALLERY_DIR: images for bench extract (default craterdex-demo/bench/images/gallery)
# Run from the repository root after `cargo build --release`; about 7 minutes on 2 Zen 5 cores.
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n '2,11p' "$0"; exit 2; }
mars=$1
nac=$2
out=$3
gallery=${4:-craterdex-demo/bench/images/gallery}
bin=./target/release/craterdex
for f in "$mars" "$nac"; do [[ -f $f ]] || { echo "no such manifest: $f" >&2; exit 2; }; done
[[ -d $gallery ]] || { echo "no gallery directory: $gallery (run craterdex demo first)" >&2; exit 2; }
[[ -x $bin ]] || { echo "no $bin: run cargo build --release first" >&2; exit 2; }
mkdir -p "$out"

"$bin" cpu | tee "$out/cpu.txt"
lscpu | grep -E 'Model name|Flags' > "$out/lscpu.txt" || true
levels=$("$bin" cpu --levels)
timed=$(for l in $levels; do [[ $l == avx512 || $l == amx ]] && printf '%s ' "$l"; done)
top=${levels##* }
timed=${timed:-$top}

for level in $timed; do
  echo "== speed and tokens at level $level"
  CRATERDEX_KERNEL=$level "$bin" bench extract --dir "$gallery" --images 64 --repeats 3 \
    | tee "$out/extract_$level.txt"
  CRATERDEX_KERNEL=$level cargo test --release -p craterdex-model --test parity -- --nocapture \
    2>&1 | grep -E 'kernel level|test result' | tee "$out/parity_$level.txt"
done

precisions="f32 int8"
grep -q -- '--precision bf16 runs here' "$out/cpu.txt" && precisions="$precisions bf16"
echo "== retrieval at level $top: $precisions"
for bench in mars nac; do
  manifest=$mars
  [[ $bench == nac ]] && manifest=$nac
  for p in $precisions; do
    "$bin" eval --manifest "$manifest" --quick --no-cache --precision "$p" \
      --json "$out/eval_${bench}_$p.json" > "$out/eval_${bench}_$p.log" 2> "$out/eval_${bench}_$p.err"
  done
  for p in $precisions; do
    [[ $p == f32 ]] && continue
    python3 scripts/compare_eval.py "$out/eval_${bench}_f32.json" "$out/eval_${bench}_$p.json" \
      > "$out/compare_${bench}_$p.txt"
    echo "$bench $p against f32: $(grep -E '^two_stage_s100_k32_int8_pairwhite_grouped ' \
      "$out/compare_${bench}_$p.txt" | awk '{print "shipped recipe mAP", $2, "->", $3, "(" $4 ")"}'); $(tail -1 "$out/compare_${bench}_$p.txt")"
  done
done | tee "$out/summary.txt"
echo "results in $out"
