#!/usr/bin/env bash
# Runs the LibTorch lane's tests under the CPU dispatch limits the numeric
# libraries honour, so that an expectation which holds only for this CPU's
# kernels fails here and not on a newcomer's machine. bf16 matmuls go through
# oneDNN (its kernel depends on AVX-512, AVX512-BF16, AMX), fp32 ones through
# OpenBLAS's dynamic-arch kernels, and ATen's own elementwise and reduction
# kernels through its AVX2/AVX-512 builds; each picks by the CPU it runs on.
#
# Usage: scripts/dispatch-limits.sh [BUILD_DIR] [-- CTEST_ARG...]
#   BUILD_DIR   a configured and built tree (default: build/)
#   PROFILES    space-separated profile names to run (default: all that this CPU can emulate)
# Prints one line per profile and a table at the end; exits 1 if any failed.
#
# Profiles (a limit above what the CPU has is left out):
#   native          no limit: what CI runs
#   avx2-machine    a CPU without AVX-512 (AMD Zen 2/3, Intel client chips):
#                   LibTorch's own bf16 gemm instead of oneDNN (NANSCOPE_ONEDNN=off:
#                   LibTorch 1.13 calls oneDNN for bf16 only on AVX-512 CPUs, so
#                   capping oneDNN's ISA would only make its bf16 primitives fail),
#                   ATen avx2, OpenBLAS Haswell
#   onednn-avx512   oneDNN AVX512_CORE (AVX-512 without VNNI or BF16)
#   onednn-vnni     oneDNN AVX512_CORE_VNNI
#   onednn-bf16     oneDNN AVX512_CORE_BF16
#   onednn-amx      oneDNN AVX512_CORE_AMX (the CPU's AMX kernels, where present)
#   openblas-skx    OpenBLAS SkylakeX kernels
#   openblas-hsw    OpenBLAS Haswell kernels
#   aten-default    ATen's kernels without AVX2 (no fused multiply-add)
# The style and install tests do no arithmetic and are left out.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
shift || true
[ "${1:-}" = "--" ] && shift
extra=("$@")
[ -f "$build/CTestTestfile.cmake" ] || { echo "dispatch-limits: $build is not a built tree (scripts/build.sh)" >&2; exit 2; }

flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]]; }
avx512=0; has avx512f && has avx512bw && has avx512vl && has avx512dq && avx512=1

declare -A env_of
env_of[native]=""
env_of[avx2-machine]="NANSCOPE_ONEDNN=off ATEN_CPU_CAPABILITY=avx2 OPENBLAS_CORETYPE=Haswell"
env_of[aten-default]="ATEN_CPU_CAPABILITY=default"
env_of[openblas-hsw]="OPENBLAS_CORETYPE=Haswell"
available=(native avx2-machine)
if [ "$avx512" = 1 ]; then
  env_of[onednn-avx512]="ONEDNN_MAX_CPU_ISA=AVX512_CORE"
  env_of[openblas-skx]="OPENBLAS_CORETYPE=SkylakeX"
  available+=(onednn-avx512 openblas-skx)
  if has avx512_vnni; then env_of[onednn-vnni]="ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI"; available+=(onednn-vnni); fi
  if has avx512_bf16; then env_of[onednn-bf16]="ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16"; available+=(onednn-bf16); fi
  if has amx_bf16 && has amx_tile; then env_of[onednn-amx]="ONEDNN_MAX_CPU_ISA=AVX512_CORE_AMX"; available+=(onednn-amx); fi
fi
available+=(openblas-hsw aten-default)
read -r -a profiles <<<"${PROFILES:-${available[*]}}"

results=()
failed=0
for p in "${profiles[@]}"; do
  if [ -z "${env_of[$p]+set}" ]; then
    results+=("$(printf '%-14s %-62s %s' "$p" "-" "not on this CPU")")
    continue
  fi
  log=$build/dispatch-$p.log
  start=$(date +%s)
  # The library's old name for the oneDNN limit is honoured too.
  vars=${env_of[$p]}
  if [[ "$vars" =~ ONEDNN_MAX_CPU_ISA=([A-Z0-9_]+) ]]; then vars+=" DNNL_MAX_CPU_ISA=${BASH_REMATCH[1]}"; fi
  echo "dispatch-limits: $p (${vars:-no limit})"
  status=0
  (cd "$build" && env $vars ctest -j2 --output-on-failure --timeout 600 -LE 'style|install' "${extra[@]}") >"$log" 2>&1 || status=$?
  summary=$(grep -E '% tests passed' "$log" | tail -1 || true)
  [ -n "$summary" ] || summary="no summary (see $log)"
  [ "$status" = 0 ] || failed=1
  results+=("$(printf '%-14s %-62s %s, %ss' "$p" "${env_of[$p]:-(none)}" "$summary" "$(( $(date +%s) - start ))")")
  [ "$status" = 0 ] || grep -E '^\s+[0-9]+ - .*\((Failed|Not Run|Timeout)\)' "$log" | sed 's/^/    failed: /' || true
done

echo
printf '%-14s %-62s %s\n' profile "environment" "result"
printf '%s\n' "${results[@]}"
exit "$failed"
