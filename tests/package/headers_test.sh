#!/usr/bin/env bash
# Package test (issue 19): every header `cmake --install` puts in a prefix compiles on its own
# against that prefix, as a user of krab::krab compiles it. A public header that includes a
# header that was not installed, or that leans on an include it does not make, fails here.
#
#   headers_test.sh BUILD_DIR
#
# One translation unit per header, in a generated CMake project that finds krab with
# find_package. The scratch directory is fixed (under BUILD_DIR), so a rerun's compiles come
# from ccache.
set -euo pipefail
build=$1
work=$build/tests/package/headers
rm -rf "$work"
mkdir -p "$work"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
start=$SECONDS

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
# One translation unit per installed header, compiled as krab::krab's users compile.
mkdir -p "$work/check"
headers=$(cd "$work/prefix/include/krab" && find . -name '*.h' | sed 's|^\./||' | sort)
{
  echo 'cmake_minimum_required(VERSION 3.18)'
  echo 'project(krab_header_check LANGUAGES CXX)'
  echo 'find_package(krab REQUIRED)'
  echo 'add_library(header_check OBJECT'
  for h in $headers; do
    tu=${h//\//_}.cpp
    echo "#include \"$h\"" >"$work/check/$tu"
    echo "  $tu"
  done
  echo ')'
  echo 'target_link_libraries(header_check PRIVATE krab::krab)'
} >"$work/check/CMakeLists.txt"
cmake -S "$work/check" -B "$work/check/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  "${launcher[@]}" >/dev/null
cmake --build "$work/check/build" -j 2 >"$work/check.log" || {
  cat "$work/check.log"
  exit 1
}
echo "package_headers: $(echo "$headers" | wc -l) installed headers compile alone, $((SECONDS - start)) s"
