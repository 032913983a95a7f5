# weft_add_test(NAME name LABELS l1 [l2] SOURCES ... LIBS ... [TIMEOUT s] [DISCOVER])
# Builds a GoogleTest binary and registers it with CTest under the given labels (tiers).
# DISCOVER registers each test case separately (use for fast unit tests).
function(weft_add_test)
  cmake_parse_arguments(T "DISCOVER;NO_GTEST_MAIN" "NAME;TIMEOUT" "LABELS;SOURCES;LIBS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  if(T_NO_GTEST_MAIN)
    target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock)
  else()
    # gtest_main, except that a binary with a skipped case exits 77 (tests/support/gtest_main.cpp).
    if(NOT TARGET weft_gtest_main)
      add_library(weft_gtest_main STATIC ${WEFT_ROOT}/tests/support/gtest_main.cpp)
      target_link_libraries(weft_gtest_main PUBLIC GTest::gtest)
      target_include_directories(weft_gtest_main PRIVATE ${WEFT_ROOT})
    endif()
    target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} weft_gtest_main GTest::gmock)
  endif()
  target_include_directories(${T_NAME} PRIVATE ${WEFT_ROOT})
  if(T_DISCOVER)
    include(GoogleTest)
    # PRE_TEST: the listing runs when ctest starts. Its default timeout (5 s) is too short for a
    # large binary's first, cold start on a busy 2-core host (CI once lost a run to it).
    gtest_discover_tests(${T_NAME} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 120
      PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
        SKIP_RETURN_CODE 77
      EXTRA_ARGS ${T_ARGS})
  else()
    add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
    # A binary in which a case was skipped exits 77: CTest reports it as skipped, never as passed.
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
      SKIP_RETURN_CODE 77)
  endif()
endfunction()

# weft_component(name SOURCES ... PUBLIC_LIBS ... PRIVATE_LIBS ...)
function(weft_component name)
  cmake_parse_arguments(C "" "" "SOURCES;PUBLIC_LIBS;PRIVATE_LIBS" ${ARGN})
  add_library(weft_${name} STATIC ${C_SOURCES})
  # Installed headers keep their folders under include/weft (cmake/install.cmake): programs include
  # <weft/actors/node.hpp>, weft's own headers include "schema/..." relative to include/weft.
  target_include_directories(weft_${name} PUBLIC
    $<BUILD_INTERFACE:${WEFT_ROOT}> $<BUILD_INTERFACE:${CMAKE_BINARY_DIR}/generated>
    $<INSTALL_INTERFACE:include> $<INSTALL_INTERFACE:include/weft>)
  target_link_libraries(weft_${name} PUBLIC ${C_PUBLIC_LIBS} PRIVATE ${C_PRIVATE_LIBS})
  add_library(weft::${name} ALIAS weft_${name})
  # Installed as weft::<name> (lib/libweft_<name>.a).
  set_target_properties(weft_${name} PROPERTIES EXPORT_NAME ${name})
endfunction()

# weft_add_fuzzer(NAME name SOURCES ... LIBS ... [SEEDS_DIR dir] [SECONDS s])
# The sources define LLVMFuzzerTestOneInput. With WEFT_FUZZ (clang) this is a libFuzzer binary run
# for SECONDS by CTest; otherwise it links tests/fuzz/fuzz_driver.cpp, which replays the seeds and a
# fixed number of deterministic mutations of them (so every build exercises the target).
function(weft_add_fuzzer)
  cmake_parse_arguments(F "" "NAME;SEEDS_DIR;SECONDS" "SOURCES;LIBS" ${ARGN})
  if(NOT F_SECONDS)
    set(F_SECONDS 20)
  endif()
  if(WEFT_FUZZ)
    add_executable(${F_NAME} ${F_SOURCES})
    target_compile_options(${F_NAME} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_options(${F_NAME} PRIVATE -fsanitize=fuzzer,address,undefined)
    set(_cmd $<TARGET_FILE:${F_NAME}> -max_total_time=${F_SECONDS} -rss_limit_mb=2048 -print_final_stats=1)
  else()
    add_executable(${F_NAME} ${F_SOURCES} ${WEFT_ROOT}/tests/fuzz/fuzz_driver.cpp)
    set(_cmd $<TARGET_FILE:${F_NAME}> --mutations 200000)
  endif()
  target_link_libraries(${F_NAME} PRIVATE ${F_LIBS})
  target_include_directories(${F_NAME} PRIVATE ${WEFT_ROOT})
  if(F_SEEDS_DIR)
    set(_corpus ${CMAKE_CURRENT_BINARY_DIR}/${F_NAME}_corpus)
    add_test(NAME ${F_NAME} COMMAND ${_cmd} ${_corpus} ${F_SEEDS_DIR})
    set_tests_properties(${F_NAME} PROPERTIES FIXTURES_REQUIRED ${F_NAME}_corpus)
    add_test(NAME ${F_NAME}_corpus_dir COMMAND ${CMAKE_COMMAND} -E make_directory ${_corpus})
    set_tests_properties(${F_NAME}_corpus_dir PROPERTIES FIXTURES_SETUP ${F_NAME}_corpus LABELS fuzz)
  else()
    add_test(NAME ${F_NAME} COMMAND ${_cmd})
  endif()
  set_tests_properties(${F_NAME} PROPERTIES LABELS fuzz TIMEOUT 600)
endfunction()
