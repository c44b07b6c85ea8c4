# The one way tests are registered: swiftkv_add_test(NAME SOURCES ... LABELS ... [LIBS ...]).
# Every test binary may exit 77 to say "skipped" (a GPU test without a device does).
find_package(Threads REQUIRED)
pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)

# A test's time limit: 120 s, scaled for sanitizer builds, which run the same work 2-15 times
# slower, and slower again on a loaded machine (test_attention takes 46 s under TSan on two idle
# cores; under 2x load it passed 120 s). A limit catches a hang, not a slow machine.
set(SWIFTKV_TEST_TIMEOUT 120)
if(SWIFTKV_ENABLE_TSAN)
  set(SWIFTKV_TEST_TIMEOUT 600)
elseif(SWIFTKV_ENABLE_ASAN)
  set(SWIFTKV_TEST_TIMEOUT 360)
endif()

function(swiftkv_add_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LABELS;LIBS" ${ARGN})
  if(NOT T_LABELS)
    message(FATAL_ERROR "swiftkv_add_test(${name}): give LABELS (unit, integration, gpu, bindings)")
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE swiftkv::swiftkv PkgConfig::CMOCKA Threads::Threads
                                        ${T_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
  target_compile_options(
    ${name} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX>:-Wall -Wextra ${SWIFTKV_WERROR_FLAG}>
                    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra${SWIFTKV_WERROR_CUDA}>)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}" SKIP_RETURN_CODE 77
                                              TIMEOUT ${SWIFTKV_TEST_TIMEOUT})
endfunction()
