#!/usr/bin/env bash
# Formats krab's C++ with .clang-format (Debian 12's clang-format 14; another version may
# format differently), or with --check lists the files that are not formatted and fails.
#   scripts/format.sh           rewrite every tracked .cpp/.h in place
#   scripts/format.sh --check   exit 1 naming each file clang-format would change
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=$(command -v clang-format-14 || command -v clang-format || true)
if [[ -z "$fmt" ]]; then
  echo "format: clang-format-14 not found (scripts/setup.sh installs it)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cc')
if [[ "${1:-}" == "--check" ]]; then
  bad=()
  for f in "${files[@]}"; do
    "$fmt" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]})); then
    printf 'format: not formatted (run scripts/format.sh): %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files formatted"
else
  "$fmt" -i "${files[@]}"
fi
