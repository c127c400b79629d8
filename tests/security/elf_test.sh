#!/usr/bin/env bash
# Security test (issue 24): what the dynamic loader and the toolchain's mitigations make of
# every executable krab builds and installs, read back with readelf.
#
#   elf_test.sh BUILD_DIR          every ELF in BUILD_DIR/bin, and what `cmake --install`
#                                  puts in a scratch prefix
#   elf_test.sh --check ELF...     the same checks on the files named (e.g. another build's)
#
# For every ELF:
#   - run path (RUNPATH or RPATH): every element an absolute directory; no empty element (the
#     loader reads it as the current directory: a library planted where krab is started from
#     would be loaded), nothing relative, no $ORIGIN, no "." or ".." component;
#   - BIND_NOW (DT_FLAGS BIND_NOW or DT_FLAGS_1 NOW) and a GNU_RELRO segment: the GOT is
#     read-only once the program runs;
#   - a position-independent executable (type DYN, DT_FLAGS_1 PIE).
# For krab itself, built and installed, also what the compiler flags leave in the binary:
#   - __stack_chk_fail referenced (-fstack-protector-strong);
#   - at least one fortified libc call, __*_chk (-D_FORTIFY_SOURCE).
# (-fstack-clash-protection leaves no mark readelf can see; the flags are checked by cmake.)
set -euo pipefail

failures=0
fail() {
  echo "FAIL $1"
  failures=$((failures + 1))
}

is_elf() { [[ -f $1 && $(head -c 4 "$1" | od -An -c | tr -d ' ') == '177ELF' ]]; }

check_runpath() {
  local elf=$1 dyn=$2 line path dir
  while IFS= read -r line; do
    path=$(sed -n 's/.*\[\(.*\)\]$/\1/p' <<<"$line")
    # One element per line, empty ones kept (a trailing ':' is one).
    while IFS= read -r dir; do
      if [[ -z $dir ]]; then
        fail "$elf: run path '$path' has an empty element (the current directory)"
      elif [[ $dir == *'$'* ]]; then
        fail "$elf: run path '$path' has '$dir' (krab uses no \$ORIGIN or other tokens)"
      elif [[ $dir != /* ]]; then
        fail "$elf: run path '$path' has a relative element '$dir'"
      elif [[ /$dir/ == */./* || /$dir/ == */../* ]]; then
        fail "$elf: run path '$path' has '$dir' with a '.' or '..' component"
      fi
    done < <(tr ':' '\n' <<<"$path")
  done < <(grep -E '\((RUNPATH|RPATH)\)' <<<"$dyn" || true)
}

check_linking() {
  local elf=$1 dyn=$2 headers
  headers=$(readelf -W -h -l "$elf")
  grep -qE '\(FLAGS\).*BIND_NOW|\(FLAGS_1\).*\bNOW\b' <<<"$dyn" ||
    fail "$elf: not linked with -z now (no BIND_NOW)"
  grep -q 'GNU_RELRO' <<<"$headers" || fail "$elf: no GNU_RELRO segment (-z relro)"
  grep -qE 'Type:[[:space:]]+DYN' <<<"$headers" && grep -qE '\(FLAGS_1\).*\bPIE\b' <<<"$dyn" ||
    fail "$elf: not a position-independent executable"
}

check_compiled() {
  local elf=$1 syms
  syms=$(readelf -W --dyn-syms "$elf" | awk '{print $8}' | sed 's/@.*//')
  grep -qx '__stack_chk_fail' <<<"$syms" ||
    fail "$elf: no __stack_chk_fail (not built with -fstack-protector-strong)"
  local fortified
  fortified=$(grep -E '^__[a-z_]+_chk$' <<<"$syms" | grep -vx '__stack_chk_fail' | sort -u || true)
  if [[ -z $fortified ]]; then
    fail "$elf: no fortified libc call (__*_chk; not built with -D_FORTIFY_SOURCE)"
  else
    echo "  $elf: $(wc -l <<<"$fortified") fortified calls ($(head -3 <<<"$fortified" | tr '\n' ' ')...)"
  fi
}

# check ELF [krab]: the run path and linking checks, and with "krab" the compiler's marks.
check() {
  local elf=$1 dyn
  dyn=$(readelf -W -d "$elf")
  check_runpath "$elf" "$dyn"
  check_linking "$elf" "$dyn"
  [[ ${2:-} == krab ]] && check_compiled "$elf"
  return 0
}

if [[ ${1:-} == --check ]]; then
  shift
  for elf in "$@"; do check "$elf" krab; done
else
  build=$1
  work=$build/tests/security/elf
  rm -rf "$work"
  mkdir -p "$work"
  count=0
  for elf in "$build"/bin/*; do
    is_elf "$elf" || continue
    count=$((count + 1))
    if [[ $(basename "$elf") == krab ]]; then check "$elf" krab; else check "$elf"; fi
  done
  [[ -x $build/bin/krab ]] || fail "$build/bin/krab is missing (build it first)"
  cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
  for elf in $(find "$work/prefix" -type f); do
    is_elf "$elf" || continue
    count=$((count + 1))
    if [[ $(basename "$elf") == krab ]]; then check "$elf" krab; else check "$elf"; fi
  done
  [[ -x $work/prefix/bin/krab ]] || fail "cmake --install put no bin/krab in $work/prefix"
  echo "checked $count ELF files"
fi
if ((failures > 0)); then
  echo "elf_test: $failures failures"
  exit 1
fi
echo "elf_test: passed"
