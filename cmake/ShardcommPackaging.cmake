# Installation: headers, the libraries, a CMake package (find_package(shardcomm) -> shardcomm::comm,
# shardcomm::shard) and pkg-config files: shardcomm-comm (libcomm alone), shardcomm-shard (libshard,
# which requires shardcomm-comm) and shardcomm (both, as before there were two). The build tree is
# a CMake package too (-Dshardcomm_DIR=<build dir>), for trying a build before installing it.
include(CMakePackageConfigHelpers)

install(TARGETS shardcomm_comm shardcomm_shard EXPORT shardcommTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/libcomm/include/libcomm ${PROJECT_SOURCE_DIR}/libshard/include/libshard
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(SHARDCOMM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/shardcomm)
install(EXPORT shardcommTargets NAMESPACE shardcomm:: DESTINATION ${SHARDCOMM_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/shardcommConfig.cmake.in
  ${PROJECT_BINARY_DIR}/shardcommConfig.cmake INSTALL_DESTINATION ${SHARDCOMM_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/shardcommConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/shardcommConfig.cmake ${PROJECT_BINARY_DIR}/shardcommConfigVersion.cmake
  DESTINATION ${SHARDCOMM_CMAKE_DIR})
# The build tree's package: the same config (it includes the targets file beside it), with targets
# that point into the build tree and its sources' headers.
export(EXPORT shardcommTargets NAMESPACE shardcomm:: FILE ${PROJECT_BINARY_DIR}/shardcommTargets.cmake)

# The .pc file finds its prefix relative to itself, so the tree can be installed anywhere
# (cmake --install --prefix ...) and still be found through PKG_CONFIG_PATH.
file(RELATIVE_PATH SHARDCOMM_PC_TO_PREFIX "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
string(REGEX REPLACE "/$" "" SHARDCOMM_PC_TO_PREFIX "${SHARDCOMM_PC_TO_PREFIX}")
foreach(_pc shardcomm shardcomm-comm shardcomm-shard)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${_pc}.pc.in ${PROJECT_BINARY_DIR}/${_pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/${_pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
