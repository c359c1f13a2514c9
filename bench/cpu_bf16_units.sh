#!/usr/bin/env bash
# dptrain in bf16 against itself in fp32 with the CPU's bf16 units taken away one by one, on one
# machine: oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA) keeps its kernels below AMX, below AVX512-BF16
# (emulated bf16 on AVX-512), or at AVX2 (with ATEN_CPU_CAPABILITY=avx2 for LibTorch's own
# kernels, as on an AVX2-only CPU). Each setting is one bench/run_bench.py run (medians of
# alternating rounds); the tables go to bench/results/<date>-cpu-bf16-units.md. Run it on a CPU
# with AMX to see all four rows; on one with AVX512-BF16 alone the first two are alike.
#   bash bench/cpu_bf16_units.sh [build/app/dptrain] [repeats]
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:-build/app/dptrain}
repeats=${2:-3}
out=bench/results/$(date +%F)-cpu-bf16-units.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
  echo "# bf16 against fp32 with the CPU's bf16 units taken away, $(date +%F)"
  echo
  echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores;" \
       "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
                 grep -xE 'avx2|avx512f|avx512_bf16|amx_tile|amx_bf16' | sort | paste -sd' ')."
  echo "Binary: $binary (dptrain $(git rev-parse --short HEAD)). Command: \`bash bench/cpu_bf16_units.sh $binary $repeats\`."
  echo
  echo "| units (environment) | first line says | fp32 img/s | bf16 img/s | bf16 / fp32 |"
  echo "|---|---|---|---|---|"
} > "$tmp/report.md"
for setting in "AMX:" "AVX512-BF16:ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16" \
               "none, AVX-512:ONEDNN_MAX_CPU_ISA=AVX512_CORE" \
               "none, AVX2:ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2"; do
  label=${setting%%:*}
  environment=${setting#*:}
  read -ra variables <<< "$environment"
  name=units-$(echo "$label" | tr -c 'A-Za-z0-9' '-')
  env "${variables[@]}" /usr/bin/python3 bench/run_bench.py --dptrain "$binary" \
    --dptrain-211 /nonexistent --python-113 /nonexistent --python-211 /nonexistent \
    --precisions fp32,bf16 --replicas 1 --repeats "$repeats" --steps 12 --warmup 3 \
    --threads 2 --out "$tmp" --name "$name" > "$tmp/$name.log"
  first_line=$(env "${variables[@]}" "$binary" train --devices cpu --width 2 --epochs 1 \
    --train-limit 64 --test-limit 32 --batch-size 32 --threads 1 --amp bf16 | sed -n 1p |
    sed 's/.*cpu: //; s/; [0-9]* thread.*//')
  /usr/bin/python3 - "$tmp"/*-"$name".json "$label" "${environment:-none}" "$first_line" \
      >> "$tmp/report.md" <<'PY'
import json, sys
record = json.load(open(sys.argv[1]))
row = record["results"]["1"]
fp32, bf16 = row["dptrain-1.13"]["images_per_second"], row["dptrain-1.13-bf16"]["images_per_second"]
print(f"| {sys.argv[2]} (`{sys.argv[3]}`) | {sys.argv[4]} | {fp32:.0f} | {bf16:.0f} | "
      f"{bf16 / fp32:.2f} |")
PY
done
echo >> "$tmp/report.md"
echo "Width 16, batch 256, 2 threads, one replica, 3 warm-up steps then 12 timed; medians of" \
     "$repeats alternating rounds." >> "$tmp/report.md"
cp "$tmp/report.md" "$out"
cat "$out"
