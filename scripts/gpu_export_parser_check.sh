#!/usr/bin/env bash
# On the GPU machine (nvidia-h100-x1 is enough: one process per case, no GPU work beyond the device query that
# Megatron's validate_args makes): the frameworks' own parsers over every `hetplan export` case.
#
# Before (here, with the build): scripts/fetch_parser_refs.sh fills .refs/ (Megatron-LM and DeepSpeed at the
# pinned commits) and .whl/ (hjson, which DeepSpeed's config module imports); then
#   scripts/export_cases.sh build-nt/hetplan .refs/export_cases
# writes the cases, so the device machine needs no build. Carry .refs and .whl.
#
#   scripts/gpu_export_parser_check.sh [CASES]     (default .refs/export_cases)
#
# Runs scripts/gpu_export_parser_check.py CASES .refs over Megatron's cases, and over DeepSpeed's where
# pydantic (v2, with pydantic-core) is importable: the device image has none, and DeepSpeed's config classes
# are pydantic models, so without a pydantic wheel in .whl/ DeepSpeed's cases are reported as not run here.
# Results in $OUT (or /tmp/parser-check-out): parser_check.json, check.log, parser_check.tgz (the cases, each
# case's worker log and result).
set -uo pipefail
cd "$(dirname "$0")/.."
cases=${1:-.refs/export_cases}
out=${OUT:-/tmp/parser-check-out}
mkdir -p "$out"
[ -f "$cases/manifest.json" ] || { echo "no $cases/manifest.json: run scripts/export_cases.sh BIN $cases first" | tee "$out/check.log"; exit 2; }
[ -d .refs/megatron-lm/megatron ] || { echo "no .refs/megatron-lm: run scripts/fetch_parser_refs.sh first" | tee "$out/check.log"; exit 2; }
# The wheels (README's line: they install into /tmp/site); harmless when the caller already did.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
frameworks=megatron
if python3 -c "import pydantic, pydantic_core, hjson; assert int(pydantic.VERSION.split('.')[0]) >= 2" 2>/dev/null; then
  frameworks=megatron,deepspeed
else
  echo "deepspeed: not run on this machine: pydantic v2 (with pydantic-core) or hjson is not importable" \
       "(DeepSpeed's config classes are pydantic models); put their CPython $(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') wheels in .whl/"
fi
work=/tmp/parser-check
rm -rf "$work"
mkdir -p "$work"
cp -r "$cases" "$work/cases"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
PYTHONUNBUFFERED=1 timeout 450 python3 scripts/gpu_export_parser_check.py "$work/cases" .refs \
  --frameworks "$frameworks" --json "$work/parser_check.json" 2>&1 | tee "$work/check.log"
rc=${PIPESTATUS[0]}
tar -czf "$out/parser_check.tgz" -C "$work" .
cp "$work/check.log" "$out/" 2>/dev/null
cp "$work/parser_check.json" "$out/" 2>/dev/null
echo "gpu_export_parser_check.sh: exit $rc (frameworks: $frameworks)"
exit "$rc"
