#!/usr/bin/env bash
# Package test (issue 19): krab installed into a scratch prefix is a library another CMake
# project builds against, and the C++ API trains a model defined outside krab.
#
#   cpp_api_test.sh SOURCE_DIR BUILD_DIR PYTHON
#
# 1. cmake --install into a scratch prefix;
# 2. examples/cpp_api is configured with find_package(krab), built and run on 2 workers x 32,
#    then on 1 worker x 64;
# 3. the installed `krab train` runs the same job (cpp_api_job.yaml);
# 4. the three models are equal (relative difference <= 1e-5).
# headers_test.sh checks the installed headers.
# The scratch directory is fixed (under BUILD_DIR), so a rerun's compiles come from ccache.
set -euo pipefail
src=$1 build=$2 python=$3
work=$build/tests/package/cpp_api
rm -rf "$work"
mkdir -p "$work"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
start=$SECONDS

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
for lib in "$work"/prefix/lib*/libkrab_*.a; do echo "installed ${lib#"$work"/prefix/}"; done

cmake -S "$src/examples/cpp_api" -B "$work/example" -DCMAKE_PREFIX_PATH="$work/prefix" \
  "${launcher[@]}" >/dev/null
cmake --build "$work/example" -j 2 >"$work/example.log" || {
  cat "$work/example.log"
  exit 1
}
echo "example built ($((SECONDS - start)) s so far)"

"$work/example/train_own_model" --out "$work/api_2x32.pt"
"$work/example/train_own_model" --workers 1 --batch 64 --out "$work/api_1x64.pt"
"$work/prefix/bin/krab" train "$src/tests/package/cpp_api_job.yaml" \
  --set "checkpoint.dir=$work/run" --report "$work/report.json" >"$work/krab_train.log" 2>&1 || {
  cat "$work/krab_train.log"
  exit 1
}

"$python" "$src/tests/package/compare_models.py" "$work/api_2x32.pt" "$work/run/model.pt"
"$python" "$src/tests/package/compare_models.py" "$work/api_2x32.pt" "$work/api_1x64.pt"
echo "package_cpp_api: passed in $((SECONDS - start)) s"
