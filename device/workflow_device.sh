#!/bin/bash
# Carried as .gpu/<branch> (G) with .whl: tree/ (the repository), megatron.tar.gz (Megatron-LM at the pinned
# commit, megatron_source.pack), whl/ and stubs/ from prepare_carry.sh, device.yaml (the run settings).
# One device call: snakemake results/gpt_126m/score.json on device-h100, corpus stages included.
G=${G:-$PWD/.gpu/g11c}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $(ls .whl/*.whl | grep -v megatron_core) "$G"/whl/*.whl "$G"/whl2/*.whl > "$OUT/pip.txt" 2>&1 || echo "pip rc=$?" >> "$OUT/pip.txt"
mkdir -p /tmp/bin
# Megatron builds its dataset helpers with make, which asks python3-config (absent from the image).
printf '#!/bin/sh\nexec python3 -c "import sysconfig; print(sysconfig.get_config_var(\\"EXT_SUFFIX\\"))"\n' > /tmp/bin/python3-config
chmod +x /tmp/bin/python3-config; export PATH=/tmp/bin:$PATH
W=/tmp/work; cp -r "$G/tree" $W; mkdir -p $W/.gpu/g11c; cp "$G/megatron.tar.gz" $W/.gpu/g11c/
cd $W; export PYTHONPATH=/tmp/site:$G/stubs:$W/src
python3 -m mlrepro.corpus.minicorpus serve --dir /tmp/mcs --port 18765 > "$OUT/serve.txt" 2>&1 &
sleep 4
start=$(date +%s)
timeout ${SMK_TIMEOUT:-300} python3 -m snakemake -c16 --scheduler greedy results/gpt_126m/score.json \
  --configfile "$G/device.yaml" --config system=device-h100 > "$OUT/snakemake.txt" 2>&1
echo "snakemake rc=$? wall_s=$(( $(date +%s) - start ))" | tee "$OUT/rc.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/rc.txt" 2>&1
mkdir -p "$OUT/results" "$OUT/logs"
cp -r results/gpt_126m "$OUT/results/" 2>/dev/null; cp -r logs/* "$OUT/logs/" 2>/dev/null
cp resources/corpora/mini_corpus/*.json "$OUT/" 2>/dev/null
find results resources -maxdepth 4 | head -80 > "$OUT/tree.txt"
tail -5 "$OUT/snakemake.txt"
