# How krab's executables are linked and which exploit mitigations they carry (issue 24):
# included from the top-level CMakeLists.txt before src/, so every target gets the same flags
# (the shared precompiled header requires that). tests/security/elf_test.sh checks the result
# with readelf over every executable the build writes and over what `cmake --install` installs.
#
# Run paths. CMake links a build-tree executable with a run path to each directory of a library
# outside the system's (here Debian's /usr/lib/x86_64-linux-gnu/openmpi/lib, where libmpi.so
# lives) and rewrites it in place at install time. To leave itself room for that rewrite it ends
# the build-tree run path with a ':', an empty element, which the dynamic loader reads as the
# current directory: a libsodium.so.23 in the directory krab was started from was loaded. So the
# run path is the install one from the start (no rewrite, no padding), made of the link
# directories themselves: absolute paths, the same in the build tree, the prefix and the .deb.
set(CMAKE_BUILD_WITH_INSTALL_RPATH ON)
set(CMAKE_INSTALL_RPATH_USE_LINK_PATH ON)

# Position-independent executables: CMAKE_POSITION_INDEPENDENT_CODE is on, and with policy
# CMP0083 it adds -pie at link time once the toolchain is known to support it. (Debian's gcc
# makes PIE by default anyway; this says so for toolchains that do not.)
include(CheckPIESupported)
check_pie_supported()

# Mitigations: stack protector, stack-clash protection, _FORTIFY_SOURCE's checked libc calls,
# a read-only GOT bound at start-up (relro + now). Where Debian's dpkg-buildflags exists, its
# flags come first, as a Debian package build would take them, without its -g -O2 (the build
# type says how to optimise; debug info would double the objects of every build) and without
# -ffile-prefix-map (it names the build directory, which would defeat the shared ccache across
# checkouts). The sanitizer builds take none of this: they are test builds, and
# _FORTIFY_SOURCE's wrappers would hide the calls ASan checks.
option(KRAB_HARDEN "Build with exploit mitigations (stack protector, FORTIFY, relro/now)" ON)
if(NOT KRAB_HARDEN OR KRAB_SANITIZE)
  return()
endif()

# _FORTIFY_SOURCE needs optimisation: glibc warns and ignores it at -O0.
set(_krab_fortify ON)
if(CMAKE_BUILD_TYPE STREQUAL "Debug")
  set(_krab_fortify OFF)
endif()

set(_krab_cflags "")
set(_krab_ldflags "")
find_program(KRAB_DPKG_BUILDFLAGS dpkg-buildflags)
if(KRAB_DPKG_BUILDFLAGS)
  set(_krab_dpkg_env "DEB_BUILD_MAINT_OPTIONS=hardening=+all reproducible=-fixfilepath,-fixdebugpath"
      "DEB_CXXFLAGS_MAINT_STRIP=-g -O2" "DEB_CFLAGS_MAINT_STRIP=-g -O2")
  foreach(_what CXXFLAGS CPPFLAGS LDFLAGS)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env ${_krab_dpkg_env}
                            ${KRAB_DPKG_BUILDFLAGS} --get ${_what}
                    OUTPUT_VARIABLE _krab_dpkg_${_what} OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "dpkg-buildflags --get ${_what} failed (${_rc}); configure with "
              "-DKRAB_DPKG_BUILDFLAGS=OFF to use krab's own hardening flags only")
    endif()
  endforeach()
  string(APPEND _krab_cflags " ${_krab_dpkg_CXXFLAGS}")
  string(APPEND _krab_ldflags " ${_krab_dpkg_LDFLAGS}")
  if(_krab_fortify)
    string(APPEND _krab_cflags " ${_krab_dpkg_CPPFLAGS}")
  endif()
  message(STATUS "Hardening: dpkg-buildflags, plus what it leaves out")
endif()

# What every hardened build has whether or not dpkg-buildflags gave it (older dpkg gives no
# stack-clash protection and no bind-now; another distribution has no dpkg-buildflags).
foreach(_flag -fstack-protector-strong -fstack-clash-protection)
  if(NOT _krab_cflags MATCHES " ${_flag}( |$)")
    string(APPEND _krab_cflags " ${_flag}")
  endif()
endforeach()
if(_krab_fortify AND NOT _krab_cflags MATCHES "_FORTIFY_SOURCE")
  string(APPEND _krab_cflags " -D_FORTIFY_SOURCE=2")
endif()
foreach(_flag -Wl,-z,relro -Wl,-z,now)
  if(NOT _krab_ldflags MATCHES " ${_flag}( |$)")
    string(APPEND _krab_ldflags " ${_flag}")
  endif()
endforeach()
string(APPEND CMAKE_C_FLAGS "${_krab_cflags}")
string(APPEND CMAKE_CXX_FLAGS "${_krab_cflags}")
foreach(_kind EXE SHARED MODULE)
  string(APPEND CMAKE_${_kind}_LINKER_FLAGS "${_krab_ldflags}")
endforeach()
message(STATUS "Hardening flags:${_krab_cflags};${_krab_ldflags}")
