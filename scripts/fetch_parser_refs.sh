#!/usr/bin/env bash
# Brings the frameworks' own parsers, at the commits the exporter was written against (planner/export_plan.h:
# kMegatronCommit, kDeepSpeedCommit), into the ignored folder .refs/ for scripts/gpu_export_parser_check.sh.
# Nothing under .refs/ is committed: it is the frameworks' code, read by the check, never copied into hetplan.
#
# With the two git directories (a bare mirror or a clone's .git: the search tool's `fetch` of
# github:NVIDIA/Megatron-LM and github:deepspeedai/DeepSpeed gives them), it extracts from them; without, it
# clones https://github.com/NVIDIA/Megatron-LM and https://github.com/deepspeedai/DeepSpeed (needs the network)
# into .refs/git/. Only the python packages are extracted:
#   .refs/megatron-lm/megatron   (Megatron-LM's `megatron` package)
#   .refs/deepspeed/deepspeed    (DeepSpeed's `deepspeed` package; its symbolic links deepspeed/accelerator and
#                                 deepspeed/ops/op_builder replaced by the folders they point to, since a link
#                                 does not travel to the device machine; deepspeed/ops/csrc is left out)
# Python packages the device machine lacks (its image: KINDS.md's list), as wheels in .whl/ (ignored):
#   hjson 3.1.0 (pure python; DeepSpeed's runtime/config.py imports it): from PyPI where pip reaches it, else
#     built here from hjson/hjson-py@$HJSON_COMMIT (the third argument: its git directory) with setup.py
#     bdist_wheel.
#   pydantic v2 with pydantic-core (compiled, CPython 3.12 on the device), annotated-types, typing-inspection:
#     DeepSpeed's config classes are pydantic models. Only from PyPI:
#       python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#         --platform manylinux_2_17_x86_64 -d .whl pydantic pydantic-core annotated-types typing-inspection
#     (versions that agree: pydantic's METADATA pins its pydantic-core). Without them the device check runs
#     Megatron's cases only and says so.
#
#   scripts/fetch_parser_refs.sh [MEGATRON_GIT_DIR DEEPSPEED_GIT_DIR [HJSON_GIT_DIR]]
set -euo pipefail
cd "$(dirname "$0")/.."

MEGATRON_COMMIT=d98e8a64ddf34856e74b24714e3bedb2f5a39553   # NVIDIA/Megatron-LM, = kMegatronCommit
DEEPSPEED_COMMIT=edaa7221267243c7be7fb49c5d5f5c4fb97b4641  # deepspeedai/DeepSpeed, = kDeepSpeedCommit
HJSON_COMMIT=9351a277df1a226fdceb00228fb5daae785447a8      # hjson/hjson-py, version 3.1.0

grep -q "kMegatronCommit = \"$MEGATRON_COMMIT\"" planner/export_plan.h ||
  { echo "fetch_parser_refs.sh: MEGATRON_COMMIT differs from planner/export_plan.h's kMegatronCommit" >&2; exit 2; }
grep -q "kDeepSpeedCommit = \"$DEEPSPEED_COMMIT\"" planner/export_plan.h ||
  { echo "fetch_parser_refs.sh: DEEPSPEED_COMMIT differs from planner/export_plan.h's kDeepSpeedCommit" >&2; exit 2; }

mg_git=${1:-}
ds_git=${2:-}
hjson_git=${3:-}
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
  echo "hjson/hjson-py $HJSON_COMMIT"
} >.refs/COMMITS

# hjson as a wheel for the device machine.
mkdir -p .whl
rm -f .whl/hjson-*.whl
if [[ -n $hjson_git ]]; then
  tmp=$(mktemp -d)
  git --git-dir="$hjson_git" archive "$HJSON_COMMIT" | tar -x -C "$tmp"
  py=python3  # setup.py bdist_wheel needs setuptools and wheel (Debian: python3-wheel)
  python3 -c 'import setuptools, wheel' 2>/dev/null || py=/usr/bin/python3
  (cd "$tmp" && "$py" setup.py -q bdist_wheel -d "$OLDPWD/.whl" >/dev/null)
  rm -rf "$tmp"
else
  python3 -m pip download -q --no-deps --only-binary=:all: -d .whl hjson==3.1.0
fi
ls -l .whl
du -sh .refs/megatron-lm .refs/deepspeed
