# Installation: headers, the library, a CMake package (find_package(shardcomm) -> shardcomm::comm)
# and a pkg-config file (pkg-config --cflags --libs shardcomm).
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

# The .pc file finds its prefix relative to itself, so the tree can be installed anywhere
# (cmake --install --prefix ...) and still be found through PKG_CONFIG_PATH.
file(RELATIVE_PATH SHARDCOMM_PC_TO_PREFIX "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
string(REGEX REPLACE "/$" "" SHARDCOMM_PC_TO_PREFIX "${SHARDCOMM_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/shardcomm.pc.in ${PROJECT_BINARY_DIR}/shardcomm.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/shardcomm.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
