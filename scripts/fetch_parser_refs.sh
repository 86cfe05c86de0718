#!/usr/bin/env bash
# Brings the frameworks' own parsers, at the commits the exporter was written against (planner/export_plan.h:
# kMegatronCommit, kDeepSpeedCommit), into the ignored folder .refs/ for scripts/gpu_export_parser_check.sh.
# Nothing under .refs/ is committed: it is the frameworks' code, read by the check, never copied into hetplan.
#
#   scripts/fetch_parser_refs.sh [MEGATRON_GIT_DIR DEEPSPEED_GIT_DIR]
#
# With the two git directories (a bare mirror or a clone's .git: the search tool's `fetch` of
# github:NVIDIA/Megatron-LM and github:deepspeedai/DeepSpeed gives them), it extracts from them; without, it
# clones https://github.com/NVIDIA/Megatron-LM and https://github.com/deepspeedai/DeepSpeed (needs the network)
# into .refs/git/. Only the python packages are extracted:
#   .refs/megatron-lm/megatron   (Megatron-LM's `megatron` package)
#   .refs/deepspeed/deepspeed    (DeepSpeed's `deepspeed` package; its symbolic links deepspeed/accelerator and
#                                 deepspeed/ops/op_builder replaced by the folders they point to, since a link
#                                 does not travel to the device machine; deepspeed/ops/csrc is left out)
# Python packages the device machine lacks: pydantic (with pydantic-core, annotated-types, typing-inspection) and
# hjson, which DeepSpeed's config module imports. Wheels for CPython 3.12 go into .whl/ (ignored), e.g.
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl pydantic pydantic-core annotated-types typing-inspection hjson
# where pip reaches PyPI (see the report of scripts/gpu_export_parser_check.py for what ran where).
set -euo pipefail
cd "$(dirname "$0")/.."

MEGATRON_COMMIT=d98e8a64ddf34856e74b24714e3bedb2f5a39553   # NVIDIA/Megatron-LM, = kMegatronCommit
DEEPSPEED_COMMIT=edaa7221267243c7be7fb49c5d5f5c4fb97b4641  # deepspeedai/DeepSpeed, = kDeepSpeedCommit

grep -q "kMegatronCommit = \"$MEGATRON_COMMIT\"" planner/export_plan.h ||
  { echo "fetch_parser_refs.sh: MEGATRON_COMMIT differs from planner/export_plan.h's kMegatronCommit" >&2; exit 2; }
grep -q "kDeepSpeedCommit = \"$DEEPSPEED_COMMIT\"" planner/export_plan.h ||
  { echo "fetch_parser_refs.sh: DEEPSPEED_COMMIT differs from planner/export_plan.h's kDeepSpeedCommit" >&2; exit 2; }

mg_git=${1:-}
ds_git=${2:-}
if [[ -z $mg_git || -z $ds_git ]]; then
  mkdir -p .refs/git
  for pair in "megatron-lm https://github.com/NVIDIA/Megatron-LM $MEGATRON_COMMIT" \
              "deepspeed https://github.com/deepspeedai/DeepSpeed $DEEPSPEED_COMMIT"; do
    read -r name url commit <<<"$pair"
    if [[ ! -d .refs/git/$name.git ]]; then
      git init -q --bare ".refs/git/$name.git"
      git --git-dir=".refs/git/$name.git" fetch -q --depth 1 "$url" "$commit"
    fi
  done
  mg_git=.refs/git/megatron-lm.git
  ds_git=.refs/git/deepspeed.git
fi

rm -rf .refs/megatron-lm .refs/deepspeed
mkdir -p .refs/megatron-lm .refs/deepspeed
git --git-dir="$mg_git" archive "$MEGATRON_COMMIT" megatron | tar -x -C .refs/megatron-lm
git --git-dir="$ds_git" archive "$DEEPSPEED_COMMIT" deepspeed | tar -x -C .refs/deepspeed
# DeepSpeed's package links to two folders beside it; bring them in as folders.
rm -f .refs/deepspeed/deepspeed/accelerator .refs/deepspeed/deepspeed/ops/op_builder .refs/deepspeed/deepspeed/ops/csrc
tmp=$(mktemp -d)
git --git-dir="$ds_git" archive "$DEEPSPEED_COMMIT" accelerator op_builder | tar -x -C "$tmp"
mv "$tmp/accelerator" .refs/deepspeed/deepspeed/accelerator
mv "$tmp/op_builder" .refs/deepspeed/deepspeed/ops/op_builder
rmdir "$tmp"
{
  echo "NVIDIA/Megatron-LM $MEGATRON_COMMIT"
  echo "deepspeedai/DeepSpeed $DEEPSPEED_COMMIT"
} >.refs/COMMITS
du -sh .refs/megatron-lm .refs/deepspeed
