# Installation layout, package configuration files and the .deb (CPack).
#
# Included once, near the end of the top-level CMakeLists.txt, after every
# component folder: each folder installs its own programs and libkolo; this
# file adds what belongs to the package as a whole:
#
#   bin/        kolo-agent kolo-coordinator kolorun kolo kolo-demo (their folders' rules)
#   lib/        libkolo.so -> libkolo.so.1 -> libkolo.so.1.x.y (client_lib)
#   include/kolo/kolo_c.h, kolo.hpp                             (client_lib)
#   lib/cmake/kolo/   koloConfig.cmake ...   find_package(kolo) -> kolo::kolo
#   lib/pkgconfig/kolo.pc                    pkg-config --cflags --libs kolo
#   lib/systemd/system/*.service, lib/sysusers.d/kolo.conf      (deploy/systemd)
#   share/kolo/*.conf.example                                   (deploy/config)
#   share/doc/kolo/                                             (docs)
#
# `cpack -G DEB` in the build folder makes kolo_<version>_<arch>.deb
# (prefix /usr). See docs/packaging.md.
include(CMakePackageConfigHelpers)

# The C ABI version, from the header (the SONAME follows it).
file(STRINGS ${PROJECT_SOURCE_DIR}/client_lib/include/kolo/kolo_c.h _kolo_abi_line
     REGEX "^#define KOLO_ABI_VERSION [0-9]+")
string(REGEX REPLACE ".*KOLO_ABI_VERSION ([0-9]+).*" "\\1" KOLO_ABI_VERSION "${_kolo_abi_line}")

set(KOLO_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kolo CACHE STRING
    "Where koloConfig.cmake is installed (relative to the prefix)")
set(KOLO_INSTALL_SYSTEMDDIR lib/systemd/system CACHE STRING
    "Where the systemd units are installed (relative to the prefix)")
set(KOLO_INSTALL_SYSUSERSDIR lib/sysusers.d CACHE STRING
    "Where the sysusers.d snippet is installed (relative to the prefix)")

# --- programs -------------------------------------------------------------
# Every program folder has its own install(TARGETS) rule (agent/,
# coordinator/, cli/, examples/cpp/, bench/), so none is added here; the
# packaging test fails if one of them stops being installed. Installed
# programs find libkolo next to them (bin/../lib) wherever the prefix is,
# without ldconfig or LD_LIBRARY_PATH.
foreach(_t kolo-agent kolo-coordinator kolorun kolo_cli kolo-demo kolo-bench)
  if(TARGET ${_t})
    set_target_properties(${_t} PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  endif()
endforeach()

# --- libkolo for other CMake projects: find_package(kolo) -> kolo::kolo ------
if(TARGET kolo_client)
  # client_lib installs kolo_client into the koloTargets export set.
  set_target_properties(kolo_client PROPERTIES EXPORT_NAME kolo)
  add_library(kolo::kolo ALIAS kolo_client)   # the same name inside this build

  install(EXPORT koloTargets NAMESPACE kolo:: FILE koloTargets.cmake
          DESTINATION ${KOLO_INSTALL_CMAKEDIR})
  configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/koloConfig.cmake.in
    ${PROJECT_BINARY_DIR}/packaging/koloConfig.cmake
    INSTALL_DESTINATION ${KOLO_INSTALL_CMAKEDIR}
    PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
  # 0.x releases keep the C ABI (SONAME libkolo.so.1): any 0.y >= the one
  # asked for will do.
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/packaging/koloConfigVersion.cmake
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/packaging/koloConfig.cmake
                ${PROJECT_BINARY_DIR}/packaging/koloConfigVersion.cmake
          DESTINATION ${KOLO_INSTALL_CMAKEDIR})

  # --- pkg-config: kolo.pc -------------------------------------------------
  # Its paths are absolute, so the file is written at install time, when the
  # real prefix is known (`cmake --install build --prefix P`, CPack's /usr).
  # Stage 1 (now) fills in everything but the prefix; stage 2 (install)
  # writes a per-destination copy and installs it.
  set(KOLO_PC_PREFIX "@KOLO_PC_INSTALL_PREFIX@")
  foreach(_kind LIBDIR INCLUDEDIR)
    if(IS_ABSOLUTE "${CMAKE_INSTALL_${_kind}}")
      set(KOLO_PC_${_kind} "${CMAKE_INSTALL_${_kind}}")
    else()
      set(KOLO_PC_${_kind} "\${prefix}/${CMAKE_INSTALL_${_kind}}")
    endif()
  endforeach()
  configure_file(${CMAKE_CURRENT_LIST_DIR}/kolo.pc.in
                 ${PROJECT_BINARY_DIR}/packaging/kolo.pc.stage1 @ONLY)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
    set(_kolo_pc_dest "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
  else()
    set(_kolo_pc_dest "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig")
  endif()
  install(CODE "
    set(KOLO_PC_INSTALL_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
    # One staging copy per destination: installs to several prefixes (a test
    # next to cpack) may run at the same time.
    string(MD5 _kolo_pc_key \"\$ENV{DESTDIR}|\${CMAKE_INSTALL_PREFIX}\")
    set(_kolo_pc_dir \"${PROJECT_BINARY_DIR}/packaging/pc-\${_kolo_pc_key}\")
    configure_file(\"${PROJECT_BINARY_DIR}/packaging/kolo.pc.stage1\" \"\${_kolo_pc_dir}/kolo.pc\" @ONLY)
    file(INSTALL DESTINATION \"${_kolo_pc_dest}\" TYPE FILE FILES \"\${_kolo_pc_dir}/kolo.pc\")
    file(REMOVE_RECURSE \"\${_kolo_pc_dir}\")
  ")
endif()

# --- deployment files and documentation ---------------------------------------
file(GLOB _kolo_units CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/deploy/systemd/*.service)
if(_kolo_units)
  install(FILES ${_kolo_units} DESTINATION ${KOLO_INSTALL_SYSTEMDDIR})
endif()
if(EXISTS ${PROJECT_SOURCE_DIR}/deploy/systemd/kolo.sysusers)
  install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/kolo.sysusers
          DESTINATION ${KOLO_INSTALL_SYSUSERSDIR} RENAME kolo.conf)
endif()
file(GLOB _kolo_conf_examples CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/deploy/config/*.example)
if(_kolo_conf_examples)
  install(FILES ${_kolo_conf_examples} DESTINATION ${CMAKE_INSTALL_DATADIR}/kolo)
endif()
if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/docs)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
endif()
foreach(_f README.md LICENSE NOTICE)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${_f})
    install(FILES ${PROJECT_SOURCE_DIR}/${_f} DESTINATION ${CMAKE_INSTALL_DOCDIR})
  endif()
endforeach()

# --- CPack: the .deb ------------------------------------------------------------
set(KOLO_PACKAGE_MAINTAINER "kolo developers <kolo-dev@localhost>" CACHE STRING
    "Maintainer field of the .deb")
set(CPACK_PACKAGE_NAME kolo)
set(CPACK_PACKAGE_VENDOR "kolo developers")
set(CPACK_PACKAGE_CONTACT "${KOLO_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "collective communication service for data-parallel deep-learning training")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${KOLO_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# The synopsis is CPACK_PACKAGE_DESCRIPTION_SUMMARY; this is the long text.
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
"kolo runs one agent per node (kolo-agent) that performs allreduce and the
other collectives for every training process of the node through shared
memory, a cluster coordinator (kolo-coordinator), the launcher kolorun, the
status CLI kolo, and the client library libkolo with its C ABI
(kolo/kolo_c.h), C++ wrapper, CMake package and pkg-config file.")
find_program(KOLO_DPKG_SHLIBDEPS dpkg-shlibdeps)
mark_as_advanced(KOLO_DPKG_SHLIBDEPS)
if(KOLO_DPKG_SHLIBDEPS)
  # Depends: computed from the ELF files (libgrpc++, libprotobuf, libucx...).
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
  # libkolo.so.1 is in the package itself (kolo-demo links it).
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_LIBRARY_OUTPUT_DIRECTORY})
else()
  message(STATUS "kolo: dpkg-shlibdeps not found; the .deb will have no Depends:")
endif()
# A shlibs file for libkolo.so.1, so packages built against it depend on us.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")

# Maintainer scripts: create the `kolo` system user and tell systemd about
# the units; nothing is enabled or started by the package.
set(_kolo_deb_scripts ${PROJECT_BINARY_DIR}/packaging/deb)
file(WRITE ${_kolo_deb_scripts}/postinst [=[#!/bin/sh
set -e
if [ "$1" = configure ]; then
  if command -v systemd-sysusers >/dev/null 2>&1; then
    systemd-sysusers kolo.conf || true
  fi
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
  fi
fi
exit 0
]=])
file(WRITE ${_kolo_deb_scripts}/prerm [=[#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl stop kolo-agent.service kolo-coordinator.service >/dev/null 2>&1 || true
fi
exit 0
]=])
file(WRITE ${_kolo_deb_scripts}/postrm [=[#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
]=])
file(CHMOD ${_kolo_deb_scripts}/postinst ${_kolo_deb_scripts}/prerm ${_kolo_deb_scripts}/postrm
     PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                 WORLD_READ WORLD_EXECUTE)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${_kolo_deb_scripts}/postinst ${_kolo_deb_scripts}/prerm ${_kolo_deb_scripts}/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_SOURCE_GENERATOR TGZ)
set(CPACK_SOURCE_IGNORE_FILES "/\\\\.git/" "/build[^/]*/" "/\\\\.cache/" "__pycache__")
include(CPack)
