# trainerd::pickle_check: the check of the pickles inside submitted TorchScript archives
# (pickle_check.h). Abseil and trainerd::common only, no LibTorch, so that its test and its fuzz
# target build in seconds; the engine links it. Included from server/engine/torchscript/CMakeLists.txt, and
# (idempotently) from tests/engine and tests/fuzz, which use the target.
include_guard(GLOBAL)
add_library(trainerd_pickle_check STATIC
  ${CMAKE_CURRENT_LIST_DIR}/pickle_check.cc
  ${CMAKE_CURRENT_LIST_DIR}/pickle_vocabulary.cc
  ${CMAKE_CURRENT_LIST_DIR}/pickle_walker.cc
  ${CMAKE_CURRENT_LIST_DIR}/pickle_walker_objects.cc)
add_library(trainerd::pickle_check ALIAS trainerd_pickle_check)
target_include_directories(trainerd_pickle_check PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(trainerd_pickle_check
  PUBLIC trainerd::common absl::status absl::statusor absl::strings)
trainerd_target_defaults(trainerd_pickle_check)
