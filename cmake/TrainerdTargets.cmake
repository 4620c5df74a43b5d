# Helpers shared by every trainerd target.

# Warnings (as errors unless TRAINERD_WARNINGS_AS_ERRORS is OFF) on trainerd's own code only;
# third-party headers come in as SYSTEM includes through imported targets.
function(trainerd_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(TRAINERD_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# Collects the transitive link closure of `target` (targets only) into `out_var`. With
# `usage_only`, follows only what propagates include directories and compile flags (skips the
# $<LINK_ONLY:...> entries that a static library's PRIVATE dependencies leave behind).
function(_trainerd_link_closure target usage_only out_var)
  set(seen "")
  set(stack "${target}")
  while(stack)
    list(POP_BACK stack current)
    if(current IN_LIST seen OR NOT TARGET ${current})
      continue()
    endif()
    list(APPEND seen ${current})
    get_target_property(aliased ${current} ALIASED_TARGET)
    if(aliased)
      list(APPEND stack ${aliased})
    endif()
    if(usage_only AND NOT current STREQUAL target)
      set(props INTERFACE_LINK_LIBRARIES)
    else()
      set(props LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
    endif()
    foreach(prop IN LISTS props)
      get_target_property(libs ${current} ${prop})
      if(libs)
        foreach(lib IN LISTS libs)
          if(usage_only AND lib MATCHES "^\\$<LINK_ONLY:")
            continue()
          endif()
          string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" lib "${lib}")
          list(APPEND stack ${lib})
        endforeach()
      endif()
    endforeach()
  endwhile()
  set(${out_var} "${seen}" PARENT_SCOPE)
endfunction()

# trainerd_check_boundaries(<target> [COMPILE_ONLY] FORBID <target>...): fails the configure step
# when <target> links any of the forbidden targets, directly or through another target. With
# COMPILE_ONLY, only what would reach <target>'s compile lines counts (a dependency's PRIVATE
# link-only libraries are allowed).
function(trainerd_check_boundaries target)
  cmake_parse_arguments(ARG "COMPILE_ONLY" "" "FORBID" ${ARGN})
  _trainerd_link_closure(${target} "${ARG_COMPILE_ONLY}" closure)
  foreach(bad IN LISTS ARG_FORBID)
    if(bad IN_LIST closure)
      message(FATAL_ERROR "boundary violated: ${target} links ${bad} (see docs/ARCHITECTURE.md)")
    endif()
  endforeach()
endfunction()

# trainerd_engine_room(<target> ROOM <room> [MAY_INCLUDE <room>...]): the defaults of an engine
# room's library (server/engine/<room>/): the repository root as include folder, LibTorch and its
# precompiled header, warnings, and a build step that fails when a file of the room includes a
# header of a room it does not declare (cmake/CheckEngineRoom.cmake; "base" is types.h, log.h,
# job_store.h and remote_ranks.h). The step runs again whenever a file of the room changes, and before the library
# builds. The link-level boundaries (no gRPC, no protos) are checked in the top-level
# CMakeLists.txt.
function(trainerd_engine_room target)
  cmake_parse_arguments(ARG "" "ROOM" "MAY_INCLUDE" ${ARGN})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  trainerd_use_torch(${target})
  trainerd_target_defaults(${target})
  file(GLOB room_files CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/server/engine/${ARG_ROOM}/*.h
       ${PROJECT_SOURCE_DIR}/server/engine/${ARG_ROOM}/*.cc)
  set(stamp ${CMAKE_CURRENT_BINARY_DIR}/${ARG_ROOM}_includes.checked)
  add_custom_command(OUTPUT ${stamp}
    COMMAND ${CMAKE_COMMAND} -DROOM=${ARG_ROOM} "-DMAY_INCLUDE=${ARG_MAY_INCLUDE}"
            -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DSTAMP=${stamp}
            -P ${PROJECT_SOURCE_DIR}/cmake/CheckEngineRoom.cmake
    DEPENDS ${room_files} ${PROJECT_SOURCE_DIR}/cmake/CheckEngineRoom.cmake
    COMMENT "Checking the includes of the engine's ${ARG_ROOM} room"
    VERBATIM)
  add_custom_target(${target}_includes DEPENDS ${stamp})
  add_dependencies(${target} ${target}_includes)
endfunction()
