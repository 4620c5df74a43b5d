# cmake -DROOM=<room> -DMAY_INCLUDE=<room;room> -DSOURCE_DIR=<repo> -DSTAMP=<file> -P CheckEngineRoom.cmake
#
# Fails when a file of the engine room server/engine/<ROOM>/ includes a header of another room that
# it does not declare in MAY_INCLUDE, or one of the files that sit above every room (engine.h,
# access.h, the engine's own .cc files' headers). "base" in MAY_INCLUDE allows the engine's base:
# types.h, log.h, job_store.h and remote_ranks.h. Run at build time by trainerd_engine_room (TrainerdTargets.cmake)
# whenever a file of the room changes; it writes STAMP when the room keeps to what it declares.
cmake_policy(SET CMP0057 NEW)  # if(IN_LIST), which a script does not get from a project
file(GLOB files "${SOURCE_DIR}/server/engine/${ROOM}/*.h" "${SOURCE_DIR}/server/engine/${ROOM}/*.cc")
set(problems "")
foreach(file IN LISTS files)
  file(STRINGS "${file}" lines REGEX "^#include [\"<]server/engine/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^#include [\"<]server/engine/([^\">]*)[\">].*" "\\1" path "${line}")
    file(RELATIVE_PATH where "${SOURCE_DIR}" "${file}")
    if(path MATCHES "^([a-z_]+)/")
      set(room "${CMAKE_MATCH_1}")
      if(NOT room STREQUAL ROOM AND NOT room IN_LIST MAY_INCLUDE)
        string(APPEND problems "  ${where} includes server/engine/${path}\n")
      endif()
    elseif(NOT ("base" IN_LIST MAY_INCLUDE AND path MATCHES "^(types|log|job_store|remote_ranks)\\.h$"))
      string(APPEND problems "  ${where} includes server/engine/${path}\n")
    endif()
  endforeach()
endforeach()
if(problems)
  if(NOT MAY_INCLUDE)
    set(MAY_INCLUDE "nothing of the engine")
  endif()
  message(FATAL_ERROR "engine room '${ROOM}' reaches beyond what it declares (it may include "
                      "${MAY_INCLUDE}; server/engine/${ROOM}/README.md):\n${problems}")
endif()
file(WRITE "${STAMP}" "")
