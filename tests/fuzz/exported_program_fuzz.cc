// libFuzzer target: the exported-program reader and checker (server/engine/training/
// exported_program.h). The first byte picks the input's use: the whole archive as it is, or the
// graph (models/model.json) or the weights' config inside an otherwise well-formed archive
// (tests/support/exported_archive.h), so that the JSON readers are reached past the zip. The check
// must return a status, never crash, and never allocate past its limits; so must the load of what
// it accepts.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/engine/training/exported_program.h"
#include "tests/support/exported_archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string archive;
  switch (data[0] % 3) {
    case 0:
      archive = rest;
      break;
    case 1:
    case 2: {
      // The well-formed one-layer program with one of its JSON records replaced by the input.
      const std::string name =
          data[0] % 3 == 1 ? "m/models/model.json" : "m/data/weights/model_weights_config.json";
      auto records = trainerd::testing::ExportedProgramRecords();
      for (auto& [record, bytes] : records) {
        if (record == name) bytes = rest;
      }
      archive = trainerd::testing::ZipArchive(records);
      break;
    }
  }
  const auto info = trainerd::engine::CheckExportedProgram(archive);
  if (info.ok()) {
    // What the check accepts is loaded too, which must end in a program or a status, never a
    // crash. It may fail: the check reads the archive's directory, graph and weight metadata, not
    // every weight's compressed bytes, so a damaged record (a local header or data miniz cannot
    // read) is found when the worker loads the program, and the job fails naming that record.
    const auto program = trainerd::engine::ExportedProgram::Load(archive);
    (void)program;
  }
  return 0;
}
