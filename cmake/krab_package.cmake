# krab as a library and a package (docs/cpp_api.md): what `cmake --install` puts in a prefix,
# the CMake package another project finds with find_package(krab), and the Debian package
# `make package` builds with CPack. Included from the top-level CMakeLists.txt after src/.
#
# The package is written by hand (krabConfig.cmake.in) rather than with install(EXPORT): krab's
# targets name the source tree in their include directories and link torch by a list of paths,
# so an exported target set would mean rewriting every layer's CMakeLists.txt. Instead the
# package has one target, krab::krab, an INTERFACE target carrying the installed static
# libraries in link order and the external packages they need, found in the consumer through
# their own configs (find_dependency).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Public headers: the seams a program uses to train its own model (docs/cpp_api.md). Installed
# under <prefix>/include/krab/ with their krab-relative paths, so "comm/communicator.h" means
# the same inside and outside krab, and so generic folder names (core/, data/, models/) stay
# out of <prefix>/include itself.
set(KRAB_PUBLIC_HEADERS
  engine/engine.h
  comm/communicator.h comm/factory.h comm/store.h comm/traffic.h
  compress/compressor.h compress/options.h compress/codecs.h
  models/model.h models/torchscript.h
  parallel/data_parallel.h parallel/dp_engine.h parallel/comm_hook.h parallel/compression_hook.h
  train/trainer.h
  core/config.h core/errors.h core/events.h
  data/dataset.h data/sampler.h)
# Included by the public headers, so installed with them; not an interface of their own.
set(KRAB_SUPPORT_HEADERS
  core/progress.h core/rng.h data/prefetch.h models/script_file.h models/script_units.h
  models/units.h
  parallel/buckets.h parallel/grad_hooks.h parallel/steps.h train/job.h
  train/report.h)

# The libraries behind the public headers: everything krab_train links, found by walking the
# targets' link libraries, so a library a layer starts to use is installed and linked without
# touching this file. Federated learning (krab_fl and below) and the CLI's launcher stay out:
# they have no public headers.
set(KRAB_PACKAGE_ROOTS krab_train)
# External link items the walk may meet, each found in the consumer by krabConfig.cmake.in.
# An item outside this list stops the configure: add its find_dependency there and here.
set(KRAB_PACKAGE_EXTERNAL yaml-cpp nlohmann_json::nlohmann_json ZLIB::ZLIB Threads::Threads
    OpenSSL::Crypto gRPC::grpc++ protobuf::libprotobuf MPI::MPI_C PNG::PNG JPEG::JPEG
    PkgConfig::KRAB_HTTPLIB
    ${TORCH_LIBRARIES})

# Depth-first over LINK_LIBRARIES (a static library's private dependencies are link
# dependencies too) and INTERFACE_LINK_LIBRARIES (interface targets such as krab_engine).
# Appends each static krab library after everything it links, so the reversed list puts every
# library before the ones it uses: the order a single-pass linker needs.
function(_krab_walk target)
  get_property(_seen GLOBAL PROPERTY _KRAB_WALKED)
  if(target IN_LIST _seen)
    return()
  endif()
  set_property(GLOBAL APPEND PROPERTY _KRAB_WALKED ${target})
  get_target_property(_type ${target} TYPE)
  set(_links "")
  if(NOT _type STREQUAL "INTERFACE_LIBRARY")
    get_target_property(_links ${target} LINK_LIBRARIES)
  endif()
  get_target_property(_iface ${target} INTERFACE_LINK_LIBRARIES)
  foreach(item IN LISTS _links _iface)
    # A static library's private dependencies appear in its interface as $<LINK_ONLY:...>.
    if(item MATCHES "^\\$<LINK_ONLY:(.+)>$")
      set(item ${CMAKE_MATCH_1})
    endif()
    if(NOT item OR item MATCHES "-NOTFOUND$")
      continue()
    elseif(TARGET ${item} AND item MATCHES "^krab_")
      _krab_walk(${item})
    elseif(NOT item IN_LIST KRAB_PACKAGE_EXTERNAL)
      message(FATAL_ERROR "cmake/krab_package.cmake: ${target} links '${item}', which the krab "
              "package does not know how to find: add it to KRAB_PACKAGE_EXTERNAL and its "
              "find_dependency to cmake/krabConfig.cmake.in")
    else()
      set_property(GLOBAL APPEND PROPERTY _KRAB_EXTERNAL_USED ${item})
    endif()
  endforeach()
  if(_type STREQUAL "STATIC_LIBRARY")
    set_property(GLOBAL APPEND PROPERTY _KRAB_POSTORDER ${target})
  endif()
endfunction()

foreach(root ${KRAB_PACKAGE_ROOTS})
  _krab_walk(${root})
endforeach()
get_property(KRAB_PACKAGE_LIBRARIES GLOBAL PROPERTY _KRAB_POSTORDER)
list(REVERSE KRAB_PACKAGE_LIBRARIES)
get_property(_used GLOBAL PROPERTY _KRAB_EXTERNAL_USED)
set(KRAB_WITH_MPI OFF)
if("MPI::MPI_C" IN_LIST _used)
  set(KRAB_WITH_MPI ON)
endif()

install(TARGETS krab RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ${KRAB_PACKAGE_LIBRARIES} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
foreach(h IN LISTS KRAB_PUBLIC_HEADERS KRAB_SUPPORT_HEADERS)
  if(NOT EXISTS ${CMAKE_SOURCE_DIR}/src/${h})
    message(FATAL_ERROR "cmake/krab_package.cmake installs src/${h}, which does not exist: "
            "update KRAB_PUBLIC_HEADERS / KRAB_SUPPORT_HEADERS (docs/cpp_api.md lists them)")
  endif()
  get_filename_component(_dir ${h} DIRECTORY)
  install(FILES ${CMAKE_SOURCE_DIR}/src/${h}
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/krab/${_dir})
endforeach()

# What krabConfig.cmake.in fills in: the external link items other than torch (which the
# consumer's own find_package(Torch) gives as TORCH_LIBRARIES) and MPI (whose target depends on
# the consumer's languages), and krab's public definitions.
set(KRAB_CONFIG_EXTERNAL ${_used})
list(REMOVE_DUPLICATES KRAB_CONFIG_EXTERNAL)
list(REMOVE_ITEM KRAB_CONFIG_EXTERNAL ${TORCH_LIBRARIES} MPI::MPI_C)  # MPI: see the template
set(KRAB_CONFIG_DEFINITIONS USE_C10D_GLOO)
if(KRAB_WITH_MPI)
  list(APPEND KRAB_CONFIG_DEFINITIONS KRAB_HAVE_MPI)
endif()

set(KRAB_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/krab)
set(KRAB_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/krab)
configure_package_config_file(
  ${CMAKE_SOURCE_DIR}/cmake/krabConfig.cmake.in ${CMAKE_BINARY_DIR}/krab-config/krabConfig.cmake
  INSTALL_DESTINATION ${KRAB_INSTALL_CMAKEDIR}
  PATH_VARS KRAB_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR)
# 0.x: a new minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/krab-config/krabConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/krab-config/krabConfig.cmake
              ${CMAKE_BINARY_DIR}/krab-config/krabConfigVersion.cmake
        DESTINATION ${KRAB_INSTALL_CMAKEDIR})

# The Debian package (`make package` -> krab_<version>_amd64.deb): everything above, under /usr.
# Depends are the runtime packages of the -dev packages scripts/setup.sh installs, one per
# library the krab executable links (package names carry the soname, so a listed package
# has the ABI krab was built against). Written out rather than computed by dpkg-shlibdeps so
# that the list is reviewable; tests/package/deb_test.sh checks that every library the
# executable needs comes from a listed package.
set(KRAB_DEBIAN_DEPENDS
  libtorch1.13 libgoogle-glog0v6             # LibTorch and the logging it brings
  libyaml-cpp0.7 zlib1g libssl3              # job files; gzip; checkpoint seals, TLS
  libgrpc++1.51 libgrpc29 libabsl20220623 libprotobuf32  # parameter server, federated RPC
  libsodium23                                # secure aggregation
  libpng16-16 libjpeg62-turbo                # image folders (data.name images)
  libopenmpi3                                # the MPI backend
  libcpp-httplib0.11                         # the etcd client (elastic rendezvous)
  libstdc++6 libgcc-s1 libc6)
list(JOIN KRAB_DEBIAN_DEPENDS ", " CPACK_DEBIAN_PACKAGE_DEPENDS)
# Not needed to run: OpenBLAS makes LibTorch's matmul much faster on CPUs, mpirun launches the
# MPI backend, spm_encode tokenises text for data.tokenizer.sentencepiece, the demo trains on
# Fashion-MNIST. The headers and libraries in the package
# also need the -dev packages (docs/cpp_api.md).
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libopenblas0-pthread, openmpi-bin, sentencepiece")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "dataset-fashion-mnist, libtorch-dev")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME krab)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "distributed training of neural networks (LibTorch)")
set(CPACK_PACKAGE_CONTACT "krab maintainers <krab@localhost>")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # krab_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)  # the executable without debug symbols: a smaller package
# cpack (and `make install`) would first build every target, the whole test suite included:
# the package needs krab and its libraries only, which `make package` builds.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)
include(CPack)
