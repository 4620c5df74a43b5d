// Visible escapes for control characters (safe_text.h).
#include "common/safe_text.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace trainerd {
namespace {

// The length of the UTF-8 sequence at `s` (1-4) and its code point, or 0 when it is not valid
// UTF-8 (overlong forms, surrogates and values past U+10FFFF included).
int DecodeUtf8(absl::string_view s, uint32_t* code) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t lead = b(0);
  if (lead < 0x80) {
    *code = lead;
    return 1;
  }
  int length = 0;
  uint32_t value = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2;
    value = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    value = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    value = lead & 0x07;
  } else {
    return 0;
  }
  if (s.size() < static_cast<size_t>(length)) return 0;
  for (int i = 1; i < length; ++i) {
    if ((b(i) & 0xC0) != 0x80) return 0;
    value = (value << 6) | (b(i) & 0x3F);
  }
  static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (value < kSmallest[length] || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
    return 0;
  }
  *code = value;
  return length;
}

// Code points that reorder or hide text on a terminal: the bidirectional marks, embeddings,
// overrides and isolates.
bool ReordersText(uint32_t c) {
  return c == 0x200E || c == 0x200F || (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069);
}

}  // namespace

std::string EscapeControls(absl::string_view text, LineBreaks breaks) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '\n' || c == '\r' || c == '\t') {
      if (breaks == LineBreaks::kKeep) {
        out += c;
      } else if (breaks == LineBreaks::kSpace) {
        out += ' ';
      } else {
        out += absl::StrFormat("\\x%02x", static_cast<uint8_t>(c));
      }
      ++i;
      continue;
    }
    uint32_t code = 0;
    const int length = DecodeUtf8(text.substr(i), &code);
    if (length == 0) {
      out += absl::StrFormat("\\x%02x", static_cast<uint8_t>(c));
      ++i;
      continue;
    }
    if (code < 0x20 || code == 0x7F) {
      out += absl::StrFormat("\\x%02x", code);
    } else if ((code >= 0x80 && code <= 0x9F) || ReordersText(code)) {
      out += absl::StrFormat("\\u%04x", code);
    } else {
      out.append(text.data() + i, static_cast<size_t>(length));
    }
    i += static_cast<size_t>(length);
  }
  return out;
}

}  // namespace trainerd
