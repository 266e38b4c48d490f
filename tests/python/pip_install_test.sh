#!/usr/bin/env bash
# pip install . as a Python user does it with Debian's packages, from a copy of
# this tree: a venv that sees Debian's torch (--system-site-packages), pip with
# Debian's setuptools (--no-build-isolation) and no package index. Then, with
# no PYTHONPATH and from another folder, `import nanscope` trains a guarded
# step and `python -m nanscope replay --help` answers.
# Usage: pip_install_test.sh REPO   (env CMAKE_ARGS: options for the extension's CMake configure, setup.py)
set -euo pipefail
repo=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/src"
tar -C "$repo" --exclude='./build*' --exclude='./.git' -cf - . | tar -C "$work/src" -xf -
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
unset PYTHONPATH
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=2 "$work/venv/bin/pip" install --no-build-isolation --no-index -q "$work/src" \
  >"$work/pip.log" 2>&1 || { tail -40 "$work/pip.log"; echo "pip install failed"; exit 1; }
echo "pip install: $(( $(date +%s) - start )) s"
cd "$work"
"$work/venv/bin/python" - <<'PY'
import torch, torch.nn.functional as F
import nanscope
print("nanscope from", nanscope.__file__)
assert "/venv/" in nanscope.__file__, nanscope.__file__
model = torch.nn.Linear(4, 1)
guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir="run", log=False)
x, y = torch.randn(8, 4), torch.randn(8, 1)
x[3, 0] = float("nan")
result = guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y))
assert not result.counted and result.first_birth == "nan at input (input) in module '', batch row 3", result
print("import nanscope: a guarded step found", result.first_birth)
PY
"$work/venv/bin/python" -m nanscope replay --help | grep -q -- "--model"
echo "pip install .: the package imports, guards a step and runs python -m nanscope"
