# The installable SDK (docs/embedding.md): `cmake --install` puts the `weft` binary, the libraries
# weft::schema, weft::gpu, weft::transport, weft::actors (static, PIC), their headers under
# include/weft, the CMake package (find_package(weft)) and weft.pc into the prefix;
# `cpack -G DEB` makes a Debian package of the same files with its dependencies declared.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(WEFT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/weft)

install(TARGETS weft_schema weft_gpu weft_transport weft_actors weft
  EXPORT weftTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT weftTargets NAMESPACE weft:: DESTINATION ${WEFT_INSTALL_CMAKEDIR})
# weft::testing (GoogleTest helpers for users' own tests): a component of its own,
# find_package(weft COMPONENTS testing), so that programs without tests need no GoogleTest.
set(WEFT_HAS_TESTING OFF)
if(TARGET weft_testing)
  set(WEFT_HAS_TESTING ON)
  install(TARGETS weft_testing EXPORT weftTestingTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT weftTestingTargets NAMESPACE weft:: DESTINATION ${WEFT_INSTALL_CMAKEDIR})
  install(DIRECTORY ${WEFT_ROOT}/testing/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weft/testing
    FILES_MATCHING PATTERN "*.hpp")
endif()

# The plot scripts that `weft train/rl/chaos --plot` run (found beside an installed binary).
install(FILES ${WEFT_ROOT}/scripts/plot_train.py ${WEFT_ROOT}/scripts/plot_rl.py
  ${WEFT_ROOT}/scripts/plot_chaos.py DESTINATION ${CMAKE_INSTALL_DATADIR}/weft/scripts)

# Headers keep their folders: include/weft/actors/node.hpp is <weft/actors/node.hpp>. Left out:
# headers that include a dependency's header which only weft's own sources may see (httplib with
# its defines, UCX's internals, CUDA kernels).
foreach(dir schema gpu transport actors)
  install(DIRECTORY ${WEFT_ROOT}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weft/${dir}
    FILES_MATCHING PATTERN "*.hpp" PATTERN "*.capnp"
    PATTERN "cuda" EXCLUDE
    PATTERN "ucx/internal" EXCLUDE
    PATTERN "http_queue.hpp" EXCLUDE)
endforeach()
install(FILES ${WEFT_CAPNP_HDRS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weft/schema)

configure_package_config_file(${WEFT_ROOT}/cmake/weftConfig.cmake.in
  ${CMAKE_BINARY_DIR}/weftConfig.cmake INSTALL_DESTINATION ${WEFT_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/weftConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/weftConfig.cmake ${CMAKE_BINARY_DIR}/weftConfigVersion.cmake
  ${WEFT_ROOT}/cmake/weftDependencies.cmake DESTINATION ${WEFT_INSTALL_CMAKEDIR})

set(WEFT_PC_CUDA_LIBS "")
if(WEFT_WITH_CUDA)
  set(WEFT_PC_CUDA_LIBS "-L${CUDAToolkit_LIBRARY_DIR} -lnccl -lcublas -lcudart")
endif()
# Relocatable: the prefix is found from where weft.pc lies (the .deb installs it under /usr).
file(RELATIVE_PATH WEFT_PC_TO_PREFIX /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
set(WEFT_PC_PREFIX "\${pcfiledir}/${WEFT_PC_TO_PREFIX}")
configure_file(${WEFT_ROOT}/cmake/weft.pc.in ${CMAKE_BINARY_DIR}/weft.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/weft.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# -- Debian package -----------------------------------------------------------------------------
# One package: the binary and the SDK. Depends: the -dev packages a program built against weft
# needs (headers and libraries of every dependency), plus what dpkg-shlibdeps finds for bin/weft.
# Build it from the `package` preset (portable -march, no CUDA: docs/embedding.md).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME weft)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "weft maintainers <weft@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "Actor runtime for serving and RL post-training of LLMs (binary and C++ SDK)")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
  "libcaf-dev (>= 0.17.6), libcapnp-dev (>= 0.9), capnproto, libucx-dev, libspdlog-dev, nlohmann-json3-dev, libopenblas-dev, libxxhash-dev, libssl-dev, libcpp-httplib-dev, zlib1g-dev, libbrotli-dev, cmake (>= 3.25), pkg-config")
if(WEFT_HAS_TESTING)
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libgtest-dev")
endif()
set(CPACK_OUTPUT_FILE_PREFIX ${CMAKE_BINARY_DIR}/packages)
include(CPack)
