#!/usr/bin/env bash
# Package test (issue 19): the Debian package CPack builds from this build tree installs into a
# scratch root and its krab runs there.
#
#   deb_test.sh BUILD_DIR VERSION
#
# cpack packs the already-built tree (as `make package` does after building krab), the .deb is
# unpacked with `dpkg -x` (no root needed, nothing touches the system's dpkg database), and
# <root>/usr/bin/krab --version must name VERSION and a commit.
set -euo pipefail
build=$1 version=$2
work=$build/tests/package/deb
rm -rf "$work"
mkdir -p "$work"
start=$SECONDS

cpack --config "$build/CPackConfig.cmake" -G DEB -B "$work/out" >"$work/cpack.log" || {
  cat "$work/cpack.log"
  exit 1
}
deb=$work/out/krab_${version}_amd64.deb
[[ -f $deb ]] || {
  echo "cpack did not write $deb:"
  ls "$work/out"
  exit 1
}
echo "built $(basename "$deb"): $(du -h "$deb" | cut -f1) ($((SECONDS - start)) s)"
echo "Depends: $(dpkg-deb -f "$deb" Depends)"

dpkg -x "$deb" "$work/root"
out=$("$work/root/usr/bin/krab" --version)
echo "$out"
if [[ ! $out =~ ^krab\ ${version//./\\.}\ \(commit\ [0-9a-z-]+\)$ ]]; then
  echo "unexpected --version output (wanted 'krab $version (commit ...)')"
  exit 1
fi
# Every library the executable needs comes from a package the .deb depends on (a library
# added to krab without its package in CPACK_DEBIAN_PACKAGE_DEPENDS fails here).
depends=" $(dpkg-deb -f "$deb" Depends | sed 's/([^)]*)//g; s/,/ /g') "
for soname in $(objdump -p "$work/root/usr/bin/krab" | awk '$1 == "NEEDED" {print $2}'); do
  owners=$(dpkg -S "*/$soname" 2>/dev/null | awk -F': ' '{print $1}' | tr ',' '\n' |
           sed 's/^ *//; s/:.*//' | sort -u)
  found=""
  for p in $owners; do [[ $depends == *" $p "* ]] && found=$p; done
  if [[ -z $found ]]; then
    echo "krab needs $soname (from: ${owners:-no installed package}), but the package does not" \
      "depend on it: add it to KRAB_DEBIAN_DEPENDS in cmake/krab_package.cmake"
    exit 1
  fi
done
echo "every library krab needs comes from a dependency"
[[ -f $work/root/usr/lib/cmake/krab/krabConfig.cmake ]] || {
  echo "the package has no CMake config"
  exit 1
}
echo "package_deb: passed in $((SECONDS - start)) s"
