// NumPy .npy parsing (the format of numpy/lib/format.py), whole or header only, and the NPY ->
// Table layout; the values' conversions are in npy_values.cc.
#include "common/npy_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/checked_size.h"
#include "common/file_io.h"
#include "common/status_macros.h"

namespace trainerd {
namespace {

// Array data is copied and read as host values.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "trainerd assumes a little-endian host");

constexpr absl::string_view kMagic("\x93NUMPY", 6);

size_t ItemSize(NpyDType dtype) { return NpyItemSize(dtype); }

// "(2, 3)", "(5,)", "()": the shape as NumPy prints it.
std::string PythonShape(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

absl::Status MalformedHeader(absl::string_view reason, absl::string_view header) {
  constexpr size_t kMaxShown = 200;
  std::string shown = absl::CHexEscape(header.substr(0, kMaxShown));
  if (header.size() > kMaxShown) shown += "...";
  return absl::InvalidArgumentError(absl::StrCat("malformed npy header (", reason, "): ", shown));
}

// The byte size of the array's data by its shape and dtype; an error for a negative dimension or
// a size that overflows int64.
absl::StatusOr<int64_t> DataBytes(const std::vector<int64_t>& shape, NpyDType dtype,
                                  absl::string_view what) {
  return CheckedByteSize(/*rows=*/1, shape, static_cast<int64_t>(ItemSize(dtype)),
                         absl::StrCat(what, " shape"));
}

// (Plain members with flags rather than std::optional: GCC 12 warns falsely about optional
// strings.)
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  bool has_descr = false;
  bool has_fortran_order = false;
  bool has_shape = false;
};

// Parses the subset of Python literal syntax that np.save writes for the header:
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<NpyHeader> Parse() {
    NpyHeader header;
    SkipSpace();
    if (!Consume('{')) return Error("expected '{'");
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      TRAINERD_ASSIGN_OR_RETURN(std::string key, ParseString());
      SkipSpace();
      if (!Consume(':')) return Error(absl::StrCat("expected ':' after '", key, "'"));
      SkipSpace();
      if (key == "descr") {
        if (header.has_descr) return Error("duplicate key 'descr'");
        if (Peek() == '[') {
          return absl::InvalidArgumentError(
              "unsupported npy dtype: structured arrays are not supported");
        }
        TRAINERD_ASSIGN_OR_RETURN(header.descr, ParseString());
        header.has_descr = true;
      } else if (key == "fortran_order") {
        if (header.has_fortran_order) return Error("duplicate key 'fortran_order'");
        TRAINERD_ASSIGN_OR_RETURN(header.fortran_order, ParseBool());
        header.has_fortran_order = true;
      } else if (key == "shape") {
        if (header.has_shape) return Error("duplicate key 'shape'");
        TRAINERD_ASSIGN_OR_RETURN(header.shape, ParseShape());
        header.has_shape = true;
      } else {
        return Error(absl::StrCat("unexpected key '", absl::CHexEscape(key), "'"));
      }
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume('}')) break;
      return Error("expected ',' or '}'");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after '}'");
    if (!header.has_descr) return Error("no 'descr' key");
    if (!header.has_fortran_order) return Error("no 'fortran_order' key");
    if (!header.has_shape) return Error("no 'shape' key");
    return header;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return MalformedHeader(absl::StrCat(what, " at character ", pos_ + 1), text_);
  }

  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  bool Consume(char c) {
    if (Peek() != c || pos_ >= text_.size()) return false;
    ++pos_;
    return true;
  }

  bool ConsumeWord(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  // A quoted string without escapes (np.save never writes any in these keys and values).
  absl::StatusOr<std::string> ParseString() {
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return Error("expected a quoted string");
    ++pos_;
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return Error("unterminated string");
    std::string value(text_.substr(pos_, end - pos_));
    if (value.find('\\') != std::string::npos) return Error("escapes in strings are not supported");
    pos_ = end + 1;
    return value;
  }

  absl::StatusOr<bool> ParseBool() {
    if (ConsumeWord("True")) return true;
    if (ConsumeWord("False")) return false;
    return Error("expected True or False");
  }

  // A tuple of non-negative integers: "()", "(5,)", "(3, 4)". Python 2 wrote "3L".
  absl::StatusOr<std::vector<int64_t>> ParseShape() {
    std::vector<int64_t> shape;
    if (!Consume('(')) return Error("expected '(' to start the shape");
    SkipSpace();
    if (Consume(')')) return shape;
    while (true) {
      SkipSpace();
      if (Peek() < '0' || Peek() > '9') return Error("expected a non-negative integer dimension");
      int64_t dim = 0;
      while (Peek() >= '0' && Peek() <= '9') {
        if (__builtin_mul_overflow(dim, 10, &dim) ||
            __builtin_add_overflow(dim, text_[pos_] - '0', &dim)) {
          return Error("dimension too large");
        }
        ++pos_;
      }
      Consume('L');
      shape.push_back(dim);
      SkipSpace();
      if (Consume(')')) break;
      if (!Consume(',')) return Error("expected ',' or ')' in the shape");
      SkipSpace();
      if (Consume(')')) break;
    }
    return shape;
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

absl::StatusOr<NpyDType> ParseDescr(const std::string& descr) {
  if (descr.size() == 3) {
    const char order = descr[0];
    const absl::string_view type = absl::string_view(descr).substr(1);
    static constexpr std::pair<absl::string_view, NpyDType> kTypes[] = {
        {"f4", NpyDType::kFloat32}, {"f8", NpyDType::kFloat64}, {"i8", NpyDType::kInt64},
        {"i4", NpyDType::kInt32},   {"i2", NpyDType::kInt16},   {"i1", NpyDType::kInt8},
        {"u8", NpyDType::kUInt64},  {"u4", NpyDType::kUInt32},  {"u2", NpyDType::kUInt16},
        {"u1", NpyDType::kUInt8},   {"b1", NpyDType::kBool},
    };
    std::optional<NpyDType> dtype;
    for (const auto& [code, value] : kTypes) {
      if (type == code) dtype = value;
    }
    if (dtype.has_value()) {
      // One-byte types have no byte order ('|'); NumPy may still write '<' or '='.
      if (order == '<' || order == '=' || order == '|' ||
          (NpyItemSize(*dtype) == 1 && order == '>')) {
        return *dtype;
      }
      if (order == '>') {
        return absl::InvalidArgumentError(
            absl::StrCat("big-endian npy dtype '", descr,
                         "' is not supported; save with arr.astype('<", type, "')"));
      }
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported npy dtype '", absl::CHexEscape(descr),
                   "' (supported: float32, float64, int8-int64, uint8-uint64 and bool; convert "
                   "others with arr.astype('<f4'))"));
}

// Reads a little-endian unsigned integer of `size` bytes at `bytes`.
uint32_t ReadLittleEndian(absl::string_view bytes, size_t offset, size_t size) {
  uint32_t value = 0;
  for (size_t i = 0; i < size; ++i) {
    value |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  }
  return value;
}

// --- NPY -> Table ---

// `columns` of each of `rows` rows of `array` (named `name` in errors).
struct Slice {
  const NpyArray* array;
  const char* name;  // "features" or "targets", for errors
  int64_t rows;
  NpyColumns columns;
};

// Converts the slice with `convert` (NpyValuesToFloat32 or NpyValuesToInt64) into `out`, after
// what it holds: in one call when the slice is whole rows, else a call per row.
template <typename T, typename Convert>
absl::Status AppendSlice(const Slice& slice, Convert convert, std::vector<T>* out) {
  const NpyArray& array = *slice.array;
  const NpyColumns& columns = slice.columns;
  const int64_t width = columns.end - columns.begin;
  const size_t start = out->size();
  out->resize(start + static_cast<size_t>(slice.rows * width));
  char* dest = reinterpret_cast<char*>(out->data() + start);
  const int64_t item = static_cast<int64_t>(ItemSize(array.dtype));
  if (width == columns.stride) {
    return convert(array.dtype, array.data.data(), slice.rows * width, dest, slice.name,
                   array.shape, 0);
  }
  for (int64_t r = 0; r < slice.rows; ++r) {
    const int64_t flat = r * columns.stride + columns.begin;
    TRAINERD_RETURN_IF_ERROR(convert(array.dtype, array.data.data() + flat * item, width,
                                     dest + r * width * static_cast<int64_t>(sizeof(T)), slice.name,
                                     array.shape, flat));
  }
  return absl::OkStatus();
}

absl::Status AppendTargets(const Slice& slice, Table* table) {
  if (table->target_dtype == TargetDType::kInt64) {
    return AppendSlice(slice, NpyValuesToInt64, &table->targets_i64);
  }
  return AppendSlice(slice, NpyValuesToFloat32, &table->targets_f32);
}

// The array's shape without its first (row) dimension.
std::vector<int64_t> PerRowShape(const NpyArrayInfo& array) {
  return std::vector<int64_t>(array.shape.begin() + 1, array.shape.end());
}

absl::Status CheckHasRows(const NpyArrayInfo& array, const char* name) {
  if (array.shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", name, " array is 0-d (a single value); it needs a first dimension of rows"));
  }
  TRAINERD_ASSIGN_OR_RETURN(
      const int64_t expected_bytes,
      DataBytes(array.shape, array.dtype, absl::StrCat("the ", name, " array's")));
  if (array.shape[0] == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", name, " array has no rows (shape ", PythonShape(array.shape), ")"));
  }
  if (expected_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", name, " array has no values per row (shape ", PythonShape(array.shape), ")"));
  }
  if (array.data_bytes != expected_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", name, " array has ", array.data_bytes, " bytes of data; shape ",
        PythonShape(array.shape), " of ", NpyDTypeName(array.dtype), " needs ", expected_bytes));
  }
  return absl::OkStatus();
}

NpyArrayInfo InfoOf(const NpyArray& array) {
  return {array.shape, array.dtype, static_cast<int64_t>(array.data.size())};
}

// Where the header starts and how long it is, from the magic string, the version and the header
// length field.
struct Preamble {
  size_t header_start = 0;
  size_t header_length = 0;
};

absl::StatusOr<Preamble> ParsePreamble(absl::string_view bytes) {
  if (bytes.substr(0, kMagic.size()) != kMagic) {
    return absl::InvalidArgumentError("not an npy file: it does not start with \\x93NUMPY");
  }
  if (bytes.size() < kMagic.size() + 2) {
    return absl::InvalidArgumentError("truncated npy file: no format version");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  if (minor != 0 || major < 1 || major > 3) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported npy format version ", major, ".",
                                                   minor, " (supported: 1.0, 2.0, 3.0)"));
  }
  const size_t length_size = major == 1 ? 2 : 4;
  Preamble preamble;
  preamble.header_start = kMagic.size() + 2 + length_size;
  if (bytes.size() < preamble.header_start) {
    return absl::InvalidArgumentError("truncated npy file: no header length");
  }
  preamble.header_length = ReadLittleEndian(bytes, kMagic.size() + 2, length_size);
  return preamble;
}

// The longest preamble: magic, version and a 4-byte header length (versions 2.0 and 3.0).
constexpr size_t kMaxPreambleBytes = 12;

// Appends the file's bytes [bytes->size(), size) to `bytes`: fewer only at the end of the file.
absl::Status ReadPrefix(int fd, const std::string& path, size_t size, std::string* bytes) {
  size_t have = bytes->size();
  bytes->resize(size);
  while (have < size) {
    const ssize_t n = ::pread(fd, bytes->data() + have, size - have, static_cast<off_t>(have));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error_number = errno;
      return absl::ErrnoToStatus(error_number, absl::StrCat(path, ": cannot read"));
    }
    have += static_cast<size_t>(n);
  }
  bytes->resize(have);
  return absl::OkStatus();
}

absl::Status WithPath(const std::string& path, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

}  // namespace

absl::StatusOr<NpyHeaderInfo> ParseNpyHeader(std::string_view std_bytes) {
  // Debian's Abseil has its own absl::string_view (not std::string_view): convert once.
  const absl::string_view bytes(std_bytes.data(), std_bytes.size());
  TRAINERD_ASSIGN_OR_RETURN(const Preamble preamble, ParsePreamble(bytes));
  const size_t header_start = preamble.header_start;
  const size_t header_length = preamble.header_length;
  if (bytes.size() - header_start < header_length) {
    return absl::InvalidArgumentError(absl::StrCat("truncated npy file: the header length is ",
                                                   header_length, " bytes but only ",
                                                   bytes.size() - header_start, " follow"));
  }
  const absl::string_view header_text = bytes.substr(header_start, header_length);
  TRAINERD_ASSIGN_OR_RETURN(NpyHeader header, HeaderParser(header_text).Parse());

  NpyHeaderInfo info;
  TRAINERD_ASSIGN_OR_RETURN(info.dtype, ParseDescr(header.descr));
  info.shape = std::move(header.shape);
  // Fortran order is harmless for at most one dimension larger than 1, but np.save only writes it
  // for arrays that are not C-contiguous; ask for C order rather than guess.
  if (header.fortran_order) {
    return absl::InvalidArgumentError(
        "npy arrays in Fortran order are not supported; save np.ascontiguousarray(arr) instead");
  }
  TRAINERD_ASSIGN_OR_RETURN(info.data_bytes, DataBytes(info.shape, info.dtype, "npy"));
  info.data_offset = static_cast<int64_t>(header_start + header_length);
  return info;
}

absl::StatusOr<NpyArray> ParseNpy(std::string_view std_bytes) {
  TRAINERD_ASSIGN_OR_RETURN(NpyHeaderInfo info, ParseNpyHeader(std_bytes));
  const absl::string_view data = absl::string_view(std_bytes.data(), std_bytes.size())
                                     .substr(static_cast<size_t>(info.data_offset));
  if (static_cast<int64_t>(data.size()) != info.data_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy data has ", data.size(), " bytes; shape ", PythonShape(info.shape),
                     " of ", NpyDTypeName(info.dtype), " needs ", info.data_bytes));
  }
  NpyArray array;
  array.shape = std::move(info.shape);
  array.dtype = info.dtype;
  array.data.assign(data.begin(), data.end());
  return array;
}

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path) {
  TRAINERD_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  absl::StatusOr<NpyArray> array = ParseNpy(bytes);
  if (!array.ok()) return WithPath(path, array.status());
  return array;
}

absl::StatusOr<NpyHeaderInfo> ReadNpyHeader(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return CannotOpen(path, errno);
  struct stat stat_info;
  if (::fstat(fd.get(), &stat_info) != 0) return CannotOpen(path, errno);
  if (S_ISDIR(stat_info.st_mode)) return CannotOpen(path, EISDIR);
  if (!S_ISREG(stat_info.st_mode)) {
    // Its size is not known before it is read to the end.
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t file_size = static_cast<size_t>(stat_info.st_size);

  // The preamble says how long the header is; then the header, or as much of it as there is.
  std::string bytes;
  TRAINERD_RETURN_IF_ERROR(
      ReadPrefix(fd.get(), path, std::min(file_size, kMaxPreambleBytes), &bytes));
  absl::StatusOr<Preamble> preamble = ParsePreamble(bytes);
  if (!preamble.ok()) return WithPath(path, preamble.status());
  const size_t header_end = preamble->header_start + preamble->header_length;
  TRAINERD_RETURN_IF_ERROR(ReadPrefix(fd.get(), path, std::min(file_size, header_end), &bytes));
  absl::StatusOr<NpyHeaderInfo> info = ParseNpyHeader(bytes);
  if (!info.ok()) return WithPath(path, info.status());

  const size_t data_size = file_size - static_cast<size_t>(info->data_offset);
  if (static_cast<int64_t>(data_size) != info->data_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": npy data has ", data_size, " bytes; shape ", PythonShape(info->shape),
                     " of ", NpyDTypeName(info->dtype), " needs ", info->data_bytes));
  }
  return info;
}

absl::StatusOr<NpyTableLayout> LayOutNpyTable(const NpyArrayInfo& features,
                                              const std::optional<NpyArrayInfo>& targets,
                                              const NpyTableOptions& options) {
  TRAINERD_RETURN_IF_ERROR(CheckHasRows(features, "features"));
  NpyTableLayout layout;
  layout.target_dtype = options.target_dtype;
  layout.rows = features.shape[0];

  if (targets.has_value()) {
    TRAINERD_RETURN_IF_ERROR(CheckHasRows(*targets, "targets"));
    if (targets->shape[0] != layout.rows) {
      return absl::InvalidArgumentError(absl::StrCat("the features array has ", layout.rows,
                                                     " rows but the targets array has ",
                                                     targets->shape[0]));
    }
    layout.feature_shape =
        features.shape.size() == 1 ? std::vector<int64_t>{1} : PerRowShape(features);
    if (targets->shape.size() > 1) {
      layout.target_shape = PerRowShape(*targets);
    } else if (options.target_dtype == TargetDType::kFloat32) {
      layout.target_shape = {1};
    }  // else a 1-D int64 target array: one scalar class index per row.
    // Both shapes passed CheckHasRows, whose byte size check covers their products.
    TRAINERD_ASSIGN_OR_RETURN(const int64_t feature_stride,
                              CheckedShapeElements(layout.feature_shape, "the feature shape"));
    TRAINERD_ASSIGN_OR_RETURN(const int64_t target_stride,
                              CheckedShapeElements(layout.target_shape, "the target shape"));
    layout.feature_columns = {feature_stride, 0, feature_stride};
    layout.target_columns = {target_stride, 0, target_stride};
    return layout;
  }

  TRAINERD_RETURN_IF_ERROR(CheckTargetColumns(options.target_columns, options.target_dtype));
  if (features.shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("without a targets array the features array must be 2-D (rows, columns); "
                     "its shape is ",
                     PythonShape(features.shape)));
  }
  const int64_t columns = features.shape[1];
  const int64_t target_columns = options.target_columns;
  if (columns <= target_columns) {
    return absl::InvalidArgumentError(
        absl::StrCat("the features array has ", columns, columns == 1 ? " column" : " columns",
                     "; with ", target_columns, target_columns == 1 ? " column" : " columns",
                     " of targets it needs at least ", target_columns + 1));
  }
  layout.feature_shape = {columns - target_columns};
  if (options.target_dtype == TargetDType::kFloat32) layout.target_shape = {target_columns};
  layout.feature_columns = {columns, 0, columns - target_columns};
  layout.target_columns = {columns, columns - target_columns, columns};
  layout.targets_in_features = true;
  return layout;
}

absl::StatusOr<Table> TableFromNpy(const NpyArray& features, const std::optional<NpyArray>& targets,
                                   const NpyTableOptions& options) {
  std::optional<NpyArrayInfo> target_info;
  if (targets.has_value()) target_info = InfoOf(*targets);
  TRAINERD_ASSIGN_OR_RETURN(const NpyTableLayout layout,
                            LayOutNpyTable(InfoOf(features), target_info, options));
  Table table;
  table.target_dtype = layout.target_dtype;
  table.rows = layout.rows;
  table.feature_shape = layout.feature_shape;
  table.target_shape = layout.target_shape;
  TRAINERD_RETURN_IF_ERROR(
      AppendSlice(Slice{&features, "features", table.rows, layout.feature_columns},
                  NpyValuesToFloat32, &table.features));
  const bool separate = targets.has_value();
  TRAINERD_RETURN_IF_ERROR(
      AppendTargets(Slice{separate ? &*targets : &features, separate ? "targets" : "features",
                          table.rows, layout.target_columns},
                    &table));
  return table;
}

}  // namespace trainerd
