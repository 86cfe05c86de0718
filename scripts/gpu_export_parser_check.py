#!/usr/bin/env python3
"""Runs the frameworks' own parsers over every `hetplan export` case (scripts/export_cases.sh).

    gpu_export_parser_check.py OUTDIR REFS [--json RESULT.json] [--frameworks megatron,deepspeed]

OUTDIR: the folder scripts/export_cases.sh wrote (manifest.json, megatron/*/megatron_args.sh,
deepspeed/*/ds_config.json). REFS: the folder scripts/fetch_parser_refs.sh filled (megatron-lm/, deepspeed/,
hjson/, COMMITS); its packages go first on sys.path.

Megatron-LM, for each megatron_args.sh, exactly as the script would start it:
  1. bash sources the emitted script with `torchrun` defined as a function that records its argument vector
     and the environment: the `export VAR=...` lines take effect as they would, "${MEGATRON_ARGS[@]}" expands
     as bash expands it. Nothing is added to the argument list.
  2. PyTorch's own torchrun parser (torch.distributed.run.get_args_parser) reads that vector: nodes, processes
     per node, rendezvous, the training script and its arguments.
  3. A fresh Python process gets the script's exported variables plus what torchrun sets for the first process
     of node 0 (WORLD_SIZE = nodes x processes per node, RANK 0, LOCAL_RANK 0, LOCAL_WORLD_SIZE, GROUP_RANK,
     MASTER_ADDR, MASTER_PORT), sys.argv = [training script] + its arguments, and runs what pretrain_gpt.py
     runs before it builds the model: megatron.training.arguments.parse_args(), validate_args(args,
     {'tokenizer_type': 'GPT2BPETokenizer'}) (pretrain_gpt.py's defaults), core_transformer_config_from_args()
     (TransformerConfig) and gpt_config_from_args() where the commit has it.
  The case fails if any step raises, or if the world size, the processes per node or the script's exported
  variables differ from the manifest's (written by export_cases.sh from the rules, not from the exports).

DeepSpeed, for each ds_config.json: deepspeed.runtime.config.DeepSpeedConfig(path, mpu) -- the object
DeepSpeedEngine builds from its `config` argument -- in a fresh process with torch.distributed initialised
for that one process (gloo) and an mpu (the model-parallel unit Megatron-DeepSpeed passes) whose
get_data_parallel_world_size() is the case's dp, so that DeepSpeed checks train_batch_size = micro-batch x
gradient accumulation x dp as it would in the job. The config file is read by DeepSpeed itself (hjson).

Prints a table (case -> OK, or the exception's last line), writes the JSON, exits 0 when every case passed,
1 when any failed (a framework that cannot be imported fails its cases, with the import error).
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.abspath(__file__)
PYTHON = [sys.executable]  # the interpreter of each case's process (--python)


def last_line(text):
    lines = [l for l in str(text).strip().splitlines() if l.strip()]
    return lines[-1].strip() if lines else ""


# ----------------------------------------------------------------------------------------------------------
# What the emitted script runs.

CAPTURE = r'''
set -e
torchrun() {
  printf '%s\0' "$@" >"$__HETPLAN_ARGV"
  env -0 >"$__HETPLAN_ENV"
}
cd "$(dirname "$__HETPLAN_SCRIPT")"
source "$__HETPLAN_SCRIPT"
'''


def run_script_capture(script):
    """The argument vector the script hands torchrun, and the variables it exports (bash itself runs it)."""
    tmp = tempfile.mkdtemp(prefix="hetplan-check-")
    try:
        argv_file, env_file = os.path.join(tmp, "argv"), os.path.join(tmp, "env")
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "__HETPLAN_SCRIPT": script,
                "__HETPLAN_ARGV": argv_file, "__HETPLAN_ENV": env_file}
        r = subprocess.run(["bash", "--noprofile", "--norc", "-c", CAPTURE], env=base, capture_output=True,
                           text=True, timeout=60)
        if r.returncode != 0 or not os.path.exists(argv_file):
            raise RuntimeError(f"bash could not run {script}: exit {r.returncode}: {last_line(r.stderr)}")
        argv = open(argv_file, "rb").read().split(b"\0")[:-1]
        env = {}
        for item in open(env_file, "rb").read().split(b"\0"):
            if b"=" in item:
                k, v = item.split(b"=", 1)
                env[k.decode()] = v.decode()
        exported = {k: v for k, v in env.items() if k not in base and k not in ("PWD", "OLDPWD", "SHLVL", "_")}
        return [a.decode() for a in argv], exported
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def torchrun_launch(argv):
    """torchrun's own parser over the launcher's arguments."""
    from torch.distributed.run import get_args_parser
    parser = get_args_parser()

    def error(message):  # argparse would exit the checker
        raise RuntimeError(f"torchrun's parser: {message}")
    parser.error = error
    a = parser.parse_args(argv)
    nnodes = a.nnodes
    if ":" in str(nnodes):
        raise RuntimeError(f"--nnodes {nnodes}: an elastic range, expected a fixed node count")
    nproc = int(a.nproc_per_node)
    return a, int(nnodes), nproc


def megatron_case(case, outdir):
    """Parent side: the launch as the script makes it; then a fresh process runs Megatron's parsers."""
    script = os.path.join(outdir, case["file"])
    argv, exported = run_script_capture(script)
    launch, nnodes, nproc = torchrun_launch(argv)
    problems = []
    if exported != case["script_env"]:
        problems.append(f"the script exports {exported}, the manifest expects {case['script_env']}")
    world = nnodes * nproc
    if world != case["world_size"]:
        problems.append(f"torchrun starts {nnodes} x {nproc} = {world} processes, the plan has {case['world_size']}")
    if nproc != case["nproc_per_node"]:
        problems.append(f"--nproc-per-node {nproc}, the hostfile has {case['nproc_per_node']} GPUs per node")
    env = dict(exported)
    env.update({"WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(nproc),
                "GROUP_RANK": "0", "ROLE_RANK": "0", "MASTER_ADDR": str(launch.master_addr),
                "MASTER_PORT": str(launch.master_port)})
    training_argv = [launch.training_script] + list(launch.training_script_args)
    return env, training_argv, problems, {"torchrun": argv[: argv.index(launch.training_script)] if
                                          launch.training_script in argv else argv}


def stand_in_for_absent_transformer_engine():
    """TransformerConfig checks that TransformerEngine's fused rope kernel is installed (apply_rope_fusion is
    on by default): a fact of the install, not of the arguments. Where TE is absent (the GPU machine has no
    TE and no package registry), a stand-in function answers that check, and the case says so. Returns True
    where it stood in."""
    try:
        import transformer_engine  # noqa: F401
        return False
    except ImportError:
        pass
    from megatron.core.models.common.embeddings import rope_utils

    def te_absent(*_args, **_kwargs):
        raise RuntimeError("TransformerEngine is not installed: stand-in for the parser check only")
    stood_in = False
    for name in ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"):
        if getattr(rope_utils, name, None) is None:
            setattr(rope_utils, name, te_absent)
            stood_in = True
    return stood_in


def megatron_worker(argv_json, refs):
    """Child side: sys.argv is the script's; the environment is torchrun's plus the script's exports."""
    sys.argv = json.loads(argv_json)
    te_stand_in = stand_in_for_absent_transformer_engine()
    from megatron.training import arguments as margs
    args = margs.parse_args(None, False)
    margs.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})  # pretrain_gpt.py's args_defaults
    cfg = margs.core_transformer_config_from_args(args)
    out = {
        "data_parallel_size": args.data_parallel_size, "tensor_model_parallel_size": args.tensor_model_parallel_size,
        "pipeline_model_parallel_size": args.pipeline_model_parallel_size, "world_size": args.world_size,
        "params_dtype": str(args.params_dtype), "fp16": args.fp16, "bf16": args.bf16,
        "use_distributed_optimizer": args.use_distributed_optimizer,
        "use_megatron_fsdp": getattr(args, "use_megatron_fsdp", None), "ckpt_format": args.ckpt_format,
        "recompute_granularity": args.recompute_granularity, "sequence_parallel": args.sequence_parallel,
        "transformer_config": type(cfg).__name__, "num_layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
        "num_query_groups": cfg.num_query_groups, "ffn_hidden_size": cfg.ffn_hidden_size,
        "normalization": cfg.normalization, "gated_linear_unit": cfg.gated_linear_unit,
        "num_layers_in_first_pipeline_stage": getattr(cfg, "num_layers_in_first_pipeline_stage", None),
        "num_layers_in_last_pipeline_stage": getattr(cfg, "num_layers_in_last_pipeline_stage", None),
        "pipeline_model_parallel_layout": str(getattr(cfg, "pipeline_model_parallel_layout", None)),
        "use_rope_scaling": getattr(args, "use_rope_scaling", None),
        "rope_scaling_factor": getattr(args, "rope_scaling_factor", None),
        "transformer_engine": "absent: its fused rope kernel stood in" if te_stand_in else "installed",
    }
    try:
        from megatron.training.argument_utils import gpt_config_from_args
    except ImportError:
        gpt_config_from_args = None
    if gpt_config_from_args is not None:
        out["gpt_model_config"] = type(gpt_config_from_args(args)).__name__
    return out


class DataParallelUnit:
    """The model-parallel unit DeepSpeedConfig asks for the data-parallel world size (as Megatron's mpu)."""

    def __init__(self, dp):
        self.dp = dp

    def get_data_parallel_world_size(self):
        return self.dp


def deepspeed_worker(config_path, dp):
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig
    # No process group is started (on a CPU-only machine DeepSpeed's CPU accelerator would compile its
    # shared-memory op to start one): the job context DeepSpeedConfig asks for is this rank (0) and, through
    # the model-parallel unit, the data-parallel size. The config itself is read by DeepSpeed's own classes.
    deepspeed.comm.get_rank = lambda *_a, **_k: 0
    cfg = DeepSpeedConfig(config_path, mpu=DataParallelUnit(dp))
    z = cfg.zero_config
    return {
        "class": "deepspeed.runtime.config.DeepSpeedConfig", "world_size": cfg.world_size,
        "train_batch_size": cfg.train_batch_size, "train_micro_batch_size_per_gpu": cfg.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "zero_stage": int(cfg.zero_optimization_stage), "fp16": bool(cfg.float16_config.enabled),
        "bf16": bool(cfg.bfloat16_config.enabled),
        "offload_optimizer": str(z.offload_optimizer.device) if z.offload_optimizer else None,
        "offload_param": str(z.offload_param.device) if z.offload_param else None,
        "zero_config_class": type(z).__name__, "pipeline": dict(cfg.pipeline) if cfg.pipeline else None,
        "deepspeed_version": getattr(deepspeed, "__version__", "?"),
    }


# ----------------------------------------------------------------------------------------------------------
# Parent: one fresh process per case.

def child(mode, payload, env, refs, result_file, timeout):
    full_env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK",
                                                                "CUDA_DEVICE_MAX_CONNECTIONS")}
    full_env.update(env)
    paths = [os.path.join(refs, d) for d in ("megatron-lm", "deepspeed") if os.path.isdir(os.path.join(refs, d))]
    full_env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH", "")] if p])
    r = subprocess.run([PYTHON[0], HERE, "--worker", mode, payload, refs, result_file], env=full_env,
                       capture_output=True, text=True, timeout=timeout)
    if os.path.exists(result_file):
        res = json.load(open(result_file))
        if not res.get("ok") and res.get("error", "").startswith("SystemExit"):
            res["error"] += ": " + last_line(r.stderr)  # argparse's message went to stderr
        return res, r
    return {"ok": False, "error": f"worker exited {r.returncode}: {last_line(r.stderr) or last_line(r.stdout)}"}, r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir")
    p.add_argument("refs")
    p.add_argument("--json", default=None, help="result file (default: OUTDIR/parser_check.json)")
    p.add_argument("--frameworks", default="megatron,deepspeed")
    p.add_argument("--logs", default=None, help="folder for each case's worker output (default: OUTDIR/logs)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per case")
    p.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1), help="cases checked at once")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter for each case's process (default: this one; a wrapper script may be given)")
    a = p.parse_args()
    PYTHON[0] = a.python
    outdir, refs = os.path.abspath(a.outdir), os.path.abspath(a.refs)
    frameworks = set(a.frameworks.split(","))
    manifest = json.load(open(os.path.join(outdir, "manifest.json")))
    logs = a.logs or os.path.join(outdir, "logs")
    os.makedirs(logs, exist_ok=True)
    commits = open(os.path.join(refs, "COMMITS")).read().split("\n") if os.path.exists(os.path.join(refs, "COMMITS")) else []
    result = {"refs": [c for c in commits if c], "python": sys.version.split()[0], "cases": []}
    try:
        import torch
        result["torch"] = torch.__version__
        result["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        result["torch"] = f"not importable: {last_line(e)}"
    selected = [c for c in manifest["cases"] if c["framework"] in frameworks]

    def run_case(index_case):
        index, case = index_case
        name = case["name"]
        res_file = os.path.join(logs, name + ".result.json")
        if os.path.exists(res_file):
            os.remove(res_file)
        entry = {"name": name, "framework": case["framework"], "what": case.get("what", ""), "file": case["file"]}
        try:
            if case["framework"] == "megatron":
                env, training_argv, problems, extra = megatron_case(case, outdir)
                entry.update(extra)
                entry["argv"] = training_argv
                entry["env"] = env
                res, r = child("megatron", json.dumps(training_argv), env, refs, res_file, a.timeout)
                if problems:
                    res = dict(res, ok=False, error="; ".join(problems + ([res["error"]] if res.get("error") else [])))
            else:
                cfg = os.path.join(outdir, case["file"])
                res, r = child("deepspeed", json.dumps({"config": cfg, "dp": case["data_parallel_size"]}),
                               {"MASTER_PORT": str(29531 + index)}, refs, res_file, a.timeout)
            with open(os.path.join(logs, name + ".log"), "w") as f:
                f.write(r.stdout + "\n--- stderr ---\n" + r.stderr)
        except Exception as e:  # noqa: BLE001 - the case fails with the exception's line
            res = {"ok": False, "error": f"{type(e).__name__}: {last_line(e)}", "traceback": traceback.format_exc()}
        entry.update(res)
        return entry

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for entry in pool.map(run_case, enumerate(selected)):  # in manifest order
            if not entry.get("ok"):
                failed += 1
            result["cases"].append(entry)
            error = entry.get("error", "")
            status = "OK" if entry.get("ok") else "FAIL " + (error if len(error) <= 300 else error[:297] + "...")
            print(f"{entry['name']:32s} {entry['framework']:9s} {status}", flush=True)
    result["passed"] = sum(1 for c in result["cases"] if c.get("ok"))
    result["failed"] = failed
    out = a.json or os.path.join(outdir, "parser_check.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{result['passed']} passed, {failed} failed")
    print(f"refs: {', '.join(result['refs'])}; python {result['python']}; torch {result.get('torch')}; "
          f"gpu {result.get('gpu')}; wrote {out}")
    return 1 if failed else 0


def worker(mode, payload, refs, result_file):
    try:
        if mode == "megatron":
            res = megatron_worker(payload, refs)
        else:
            d = json.loads(payload)
            res = deepspeed_worker(d["config"], d["dp"])
        res = {"ok": True, "details": res}
    except BaseException as e:  # noqa: BLE001 - SystemExit from argparse included
        res = {"ok": False, "error": f"{type(e).__name__}: {last_line(e) or repr(e)}",
               "traceback": traceback.format_exc()}
    with open(result_file, "w") as f:
        json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.exit(worker(*sys.argv[2:6]))
    sys.exit(main())
