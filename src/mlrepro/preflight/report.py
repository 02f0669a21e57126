"""env_checklist.md: the baseline checklist's environment checklist, filled in from a preflight record."""

from __future__ import annotations

from mlrepro.preflight import NA

MARK = {"pass": "[x]", "warn": "[!]", "fail": "[ ]", NA: "[-]"}


def _line(verdict: str, text: str) -> str:
    return f"- {MARK.get(verdict, '[ ]')} **{verdict}** {text}"


def checklist(doc: dict) -> str:
    v = doc["versions"]
    s = doc["summary"]
    out = [f"# Environment checklist: {doc['system']}", "",
           f"Overall: **{s['verdict']}** ({len(doc['hosts'])} host(s), preflight took {doc.get('seconds', '?')} s). "
           "Marks: [x] pass, [!] warn, [ ] fail, [-] not applicable.", "",
           "## 1. Software stack", ""]
    for key, label in (("driver", "NVIDIA driver"), ("driver_cuda", "CUDA the driver supports"), ("nvcc", "CUDA toolkit (nvcc)"),
                       ("torch", "PyTorch"), ("torch_cuda", "PyTorch built for CUDA"), ("nccl", "NCCL (in PyTorch)"),
                       ("cudnn", "cuDNN"), ("transformer_engine", "Transformer Engine"), ("apex", "Apex"), ("python", "Python")):
        out.append(f"- {label}: `{v.get(key) or NA}`")
    out.append(f"- Frozen package list: {len(v.get('packages', []))} packages in preflight.json (`versions.packages`)")
    for host in doc["hosts"]:
        out += ["", f"## 2. Host {host['host']}: {host['verdict']}", ""]
        for c in host["checks"]:
            out.append(_line(c["verdict"], f"`{c['name']}`: {c['why']}"))
        for g in host["gpus"]:
            out.append(_line(g["verdict"], f"GPU{g['index']} {g['name']}, {g['memory_gib']} GiB, "
                                           f"matmul {g.get('matmul_bf16_tflops')} TFLOP/s, copy {g.get('copy_tbps')} TB/s: {g['why']}"))
        topo = host.get("topology") or {}
        if topo.get("matrix"):
            names = topo["gpus"]
            out += ["", "Topology (`nvidia-smi topo -m`):", "", "| | " + " | ".join(names) + " | CPU affinity | NUMA |",
                    "|---" * (len(names) + 3) + "|"]
            for a in names:
                out.append(f"| {a} | " + " | ".join(topo["matrix"][a][b] for b in names)
                           + f" | {topo['cpu_affinity'].get(a)} | {topo['numa_affinity'].get(a)} |")
        if host["allreduce"]:
            out += ["", f"all_reduce ({host.get('allreduce_tool')}), busbw = algbw x 2(n-1)/n:", "",
                    "| bytes | busbw GB/s |", "|---|---|"]
            out += [f"| {r['bytes']} | {r['busbw_gbps']} |" for r in host["allreduce"]]
    out += ["", "## 3. Container", "",
            "- The baseline checklist's flags for a training container: `--gpus all --ipc=host --ulimit memlock=-1 "
            "--ulimit stack=67108864`. This record is from the host; run `mlrepro preflight` inside the image "
            "to check that the container sees its GPUs.", ""]
    return "\n".join(out)
