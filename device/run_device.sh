#!/bin/bash
# GPT-126M through Megatron-LM's pretrain_gpt.py on the device machine (one call, everything carried
# in .gpu/g11b: Megatron-LM at the pinned commit, wheels, the preprocess stage's .bin/.idx and
# tokenizer, the launch lines mlrepro rendered). Arms: torch SDPA attention, then Megatron's unfused.
G=${G:-$PWD/.gpu/g11b}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_DEVICE_MAX_CONNECTIONS=1
PY=${PY:-python3}
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$G"/whl/*.whl \
  || { echo "wheel install failed" | tee "$OUT/rc.txt"; exit 1; }
export PYTHONPATH=$G/stubs:/tmp/site${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}
mkdir -p /tmp/meg /tmp/data /tmp/bin
tar -xzf "$G/megatron.tar.gz" -C /tmp/meg && cp "$G"/data/* /tmp/data/ && cp "$G/sdpa_spec.py" /tmp/meg/
# Megatron's Makefile names the helper module with python3-config, which slim images lack.
if ! command -v python3-config >/dev/null; then
  printf '#!/bin/sh\nexec %s -c "import sysconfig; print(sysconfig.get_config_var(\\"EXT_SUFFIX\\"))"\n' "$PY" > /tmp/bin/python3-config
  chmod +x /tmp/bin/python3-config; export PATH=/tmp/bin:$PATH
fi
make -C /tmp/meg/megatron/core/datasets > "$OUT/env.txt" 2>&1 || { echo "helpers build failed" >> "$OUT/rc.txt"; }
{ nvidia-smi; $PY -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no cuda')"
  $PY -c "import pydantic, yaml, regex, einops; print('pydantic', pydantic.VERSION)"; } >> "$OUT/env.txt" 2>&1
cd /tmp/meg || exit 1
for arm in ${ARMS:-sdpa unfused}; do
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/smi_$arm.csv" 2>/dev/null &
  smi=$!
  start=$(date +%s)
  timeout "${ARM_TIMEOUT:-200}" bash "$G/launch_$arm.sh" > "$OUT/megatron_$arm.log" 2>&1
  echo "$arm rc=$? wall_s=$(( $(date +%s) - start ))" >> "$OUT/rc.txt"
  kill $smi 2>/dev/null
done
cat "$OUT/rc.txt"
