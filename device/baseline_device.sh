#!/bin/bash
# Issue 12's baseline on the device machine (one H100), in one device call:
#   snakemake results/baseline/device-h100/baseline.json   (preflight, the Megatron-LM rows, the probe rows)
# Carried (device tool `carry`, all git-excluded under the checkout that travels):
#   $T   the repository (a copy of the tree under test), e.g. .gpu/mb12/tree
#   $G   from prepare_carry.sh: megatron.tar.gz (Megatron-LM at the pinned commit, megatron_source.pack),
#        whl/ and whl2/ (wheels the device image lacks), stubs/; and .whl (the workflow's wheels)
# Settings: baseline_device.yaml (the workflow's `pretrain: {megatron: <tarball>}`) and
# baseline_preflight.yaml (config/preflight.yaml for this call: the probe's first run only, short
# Megatron runs under a timeout), both beside this script; PREFLIGHT_YAML names another settings file.
# Back in $OUT (at most 8 files): baseline.json, the report (.md, .html, .png), Megatron's logs, rc.txt.
SYSTEM=${SYSTEM:-device-h100}   # config/systems/<name>.yaml of the machine (device-h100, device-h200)
T=${T:-$PWD/.gpu/mb12/tree}
G=${G:-$PWD/.gpu/g11c}
WHL=${WHL:-$PWD/.whl}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=device
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  $(ls "$WHL"/*.whl | grep -v megatron_core) "$G"/whl/*.whl "$G"/whl2/*.whl > /tmp/pip.txt 2>&1 || { echo "pip failed"; tail -5 /tmp/pip.txt; }
mkdir -p /tmp/bin
# Megatron builds its dataset helpers with make, which asks python3-config (absent from the image).
printf '#!/bin/sh\nexec python3 -c "import sysconfig; print(sysconfig.get_config_var(\\"EXT_SUFFIX\\"))"\n' > /tmp/bin/python3-config
chmod +x /tmp/bin/python3-config; export PATH=/tmp/bin:$PATH
W=/tmp/work; rm -rf $W; cp -r "$T" $W; mkdir -p $W/.gpu/g11c; cp "$G/megatron.tar.gz" $W/.gpu/g11c/
cd $W; export PYTHONPATH=/tmp/site:$G/stubs:$W/src
cp "${PREFLIGHT_YAML:-$HERE/baseline_preflight.yaml}" config/preflight.yaml
start=$(date +%s)
timeout ${SMK_TIMEOUT:-480} python3 -m snakemake -c16 --scheduler greedy results/baseline/$SYSTEM/baseline.json \
  --configfile $HERE/baseline_device.yaml --config system=$SYSTEM > /tmp/snakemake.txt 2>&1
echo "snakemake rc=$? wall_s=$(( $(date +%s) - start ))" | tee "$OUT/rc.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/rc.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)" >> "$OUT/rc.txt" 2>&1
tail -40 /tmp/snakemake.txt >> "$OUT/rc.txt"
B=results/baseline/$SYSTEM
cp $B/baseline.json $B/baseline_report.md $B/baseline_report.html $B/baseline.png "$OUT/" 2>/dev/null
mkdir -p "$OUT/logs"
# Megatron's own logs (the rows' source) and the stage logs, in one file each to stay under 8 files.
cat $B/megatron_*.launch.sh $B/megatron_bf16.log > "$OUT/logs/megatron_bf16.log" 2>/dev/null
cat $B/megatron_fp16.log > "$OUT/logs/megatron_fp16.log" 2>/dev/null
cat logs/preflight/*.log logs/baseline/*.log logs/baseline/*/*.log /tmp/pip.txt > "$OUT/logs/stages.log" 2>/dev/null
grep -h '"workload"' $B/megatron_*.json | head -3
tail -5 /tmp/snakemake.txt
