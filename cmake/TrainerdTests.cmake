# How the GoogleTest binaries become ctest tests.
#
# trainerd_add_gtests(<target> LABEL <label> [SHARDS <n>] [TIMEOUT <seconds>] [COST <c>])
#
# Registers <target> as <n> ctest tests, <target>/<i>of<n>, each running the whole binary with
# GoogleTest's own sharding (GTEST_TOTAL_SHARDS, GTEST_SHARD_INDEX): every test case runs exactly
# once, in one of the shards, and ctest -j spreads the shards over the cores.
#
# Why not gtest_discover_tests, one process per test case: most of these binaries link LibTorch
# and gRPC, whose start-up (loading and relocating a few hundred MB of shared libraries, static
# initialisers) costs 0.2-0.5 s per process here and about 3 s under AddressSanitizer, against a
# few milliseconds for most test cases. With ~1,400 test cases that start-up was most of
# `make test` and nearly all of `make test-asan`. Running each binary whole also checks that its
# test cases do not depend on running alone.
#
# COST: ctest starts the costliest tests first (on a fresh clone it has no timings of its own
# yet), so that a long shard does not start last and run alone on a core the others have left.
#
# A failing shard's output (--output-on-failure) names the failing cases (--gtest_brief=1 prints
# only those); run one case with the binary itself, e.g.
#   build/release/tests/engine/engine_test --gtest_filter='TrainerTest.*'
# or configure with -DTRAINERD_TESTS_PER_CASE=ON to get one ctest test per case again.
option(TRAINERD_TESTS_PER_CASE "Register one ctest test per GoogleTest case (slow; for debugging)" OFF)

function(trainerd_add_gtests target)
  cmake_parse_arguments(ARG "" "LABEL;SHARDS;TIMEOUT;COST" "" ${ARGN})
  if(NOT ARG_LABEL)
    message(FATAL_ERROR "trainerd_add_gtests(${target}): LABEL is required")
  endif()
  if(NOT ARG_SHARDS)
    set(ARG_SHARDS 1)
  endif()
  if(NOT ARG_TIMEOUT)
    # Generous: the sanitizer build runs the same shards several times slower.
    set(ARG_TIMEOUT 900)
  endif()
  if(NOT ARG_COST)
    set(ARG_COST 0)
  endif()
  if(TRAINERD_TESTS_PER_CASE)
    gtest_discover_tests(${target} DISCOVERY_MODE PRE_TEST
      PROPERTIES LABELS "${ARG_LABEL}" TIMEOUT ${ARG_TIMEOUT})
    return()
  endif()
  math(EXPR last "${ARG_SHARDS} - 1")
  foreach(i RANGE 0 ${last})
    set(name "${target}/${i}of${ARG_SHARDS}")
    add_test(NAME ${name} COMMAND ${target} --gtest_brief=1)
    set_tests_properties(${name} PROPERTIES
      LABELS "${ARG_LABEL}"
      TIMEOUT ${ARG_TIMEOUT}
      COST ${ARG_COST}
      ENVIRONMENT "GTEST_TOTAL_SHARDS=${ARG_SHARDS};GTEST_SHARD_INDEX=${i}")
  endforeach()
endfunction()
