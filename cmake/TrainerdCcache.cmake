# Compiles through ccache when it is installed, so that a fresh clone, a second build folder (the
# sanitizer build, `make demo` after `make test`) or a switch between branches reuses earlier
# compiles. The cache lives outside the clone, beside the torch environment
# (${XDG_CACHE_HOME:-~/.cache}/trainerd/ccache, or TRAINERD_CCACHE_DIR), so deleting build/ keeps
# it; without ccache the build is the same, only slower to redo.
#
# The settings travel on the command line (`env VAR=... ccache`) rather than in a ccache.conf, so
# that a developer's own ~/.config/ccache is not edited. The sloppiness lets ccache cache the
# translation units that use the precompiled LibTorch header (cmake/TrainerdTorch.cmake): GCC's
# .gch is itself cached, so its dependants hit too.
option(TRAINERD_CCACHE "Compile through ccache when it is found" ON)
set(TRAINERD_CCACHE_DIR "$ENV{TRAINERD_CCACHE_DIR}" CACHE PATH "ccache's cache folder (empty: the default beside the torch environment)")
if(TRAINERD_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(TRAINERD_CCACHE_PROGRAM ccache)
  if(TRAINERD_CCACHE_PROGRAM)
    set(_dir "${TRAINERD_CCACHE_DIR}")
    if(_dir STREQUAL "")
      if(DEFINED ENV{XDG_CACHE_HOME} AND NOT "$ENV{XDG_CACHE_HOME}" STREQUAL "")
        set(_dir "$ENV{XDG_CACHE_HOME}/trainerd/ccache")
      else()
        set(_dir "$ENV{HOME}/.cache/trainerd/ccache")
      endif()
    endif()
    set(CMAKE_CXX_COMPILER_LAUNCHER
        env "CCACHE_DIR=${_dir}" "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
            CCACHE_MAXSIZE=8G CCACHE_COMPRESS=1 CCACHE_BASEDIR=${CMAKE_SOURCE_DIR} "${TRAINERD_CCACHE_PROGRAM}")
    message(STATUS "trainerd: compiling through ccache, cache in ${_dir}")
    unset(_dir)
  endif()
endif()
