#!/usr/bin/env bash
# SR3 super-resolution training throughput and quality on one GPU (issue 18 part 4), through the
# worker's own entry point (python -m accelbench.workers.diffusion), on a synthetic PNG dataset it
# writes first. Run from the repository root after `source benchmarks/device_setup.sh` (and the
# diffusers wheel: carry .wheels). Results: $OUT/diffusion-sr/<case>.json and run.log.
#
#   bash benchmarks/diffusion_sr/run.sh            # cases below, in order
set -euo pipefail
out="${OUT:-results}/diffusion-sr"
mkdir -p "$out"
data=/tmp/sr-data-128
common=(--data "$data" --synthetic 2048 --eval-images 16 --size 128 --scale 4 --channels 64,128,256,512
        --layers-per-block 2 --attention-levels 1 --steps 40 --warmup-steps 5 --sample-steps 50)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/machine.txt" || true
for case in "bf16-b64:--batch 64 --precision bf16" "fp32-b64:--batch 64 --precision fp32" \
            "bf16-b128:--batch 128 --precision bf16"; do
    name="${case%%:*}"; read -r -a extra <<< "${case#*:}"
    echo "== $name: ${common[*]} ${extra[*]}" | tee -a "$out/run.log"
    python3 -m accelbench.workers.diffusion "${common[@]}" "${extra[@]}" --out "$out/$name.json" \
        2>&1 | tee -a "$out/run.log" | grep -E "SR3 UNet|held-out|step 40/" || true
done
