#!/usr/bin/env bash
# Runs fuzz targets for a bounded time each, from the committed seeds (fuzz/seeds/<target>)
# plus the run's own growing corpus (fuzz/corpus/<target>, not committed), under
# AddressSanitizer with a 2 GiB memory ceiling and a 10 s per-input limit. Prints each
# target's executions and fails on the first crash, leak, out-of-memory or timeout (the
# input is left in fuzz/artifacts/<target>/).
# Usage: fuzz/run.sh SECONDS [TARGET...]     (default: every target)
# Needs cargo-fuzz (cargo install cargo-fuzz --locked --version 0.13.2). The sanitizer flags
# are unstable rustc options; RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:?usage: fuzz/run.sh SECONDS [TARGET...]}
shift
export RUSTC_BOOTSTRAP=1
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
cargo fuzz build -O
summary=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "seeds/$t"
  log=$(mktemp)
  if ! cargo fuzz run -O "$t" "corpus/$t" "seeds/$t" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 > "$log" 2>&1; then
    tail -60 "$log"
    echo "fuzz target $t failed; the input is in fuzz/artifacts/$t/" >&2
    exit 1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  corpus=$(ls "corpus/$t" | wc -l)
  summary+=("$(printf '%-16s %10s executions in %ss, corpus %s inputs' "$t" "$runs" "$seconds" "$corpus")")
  rm -f "$log"
done
printf '%s\n' "${summary[@]}"
