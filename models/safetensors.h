// safetensors read and write (https://huggingface.co/docs/safetensors: an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {..}}, then the
// data buffer), with full validation of untrusted files.
//
// Opening validates everything before any tensor is read: the header length against the file size,
// the JSON (well-formed, an object, each entry with exactly the known fields), dtypes known, shapes
// non-negative, each tensor's byte span equal to shape x dtype size, offsets inside the data buffer,
// no two tensors overlapping and no hole in the buffer (the format forbids both). Every failure is a
// FormatError naming the file, the tensor and the problem. Writing goes to a temporary name, is
// fsynced and renamed, so an interrupted save never leaves a half file under the real name.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/file_io.h"

namespace strata::models {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;         // as in the file: "F32", "BF16", "I64", ...
  std::optional<DType> dtype;     // set for the float types Strata computes in (F32, BF16, F16)
  std::vector<std::int64_t> shape;
  std::uint64_t data_begin = 0;   // offsets inside the data buffer
  std::uint64_t data_end = 0;

  std::uint64_t elems() const;
  std::uint64_t bytes() const { return data_end - data_begin; }
};

// Bytes per element of a safetensors dtype name; 0 if unknown.
std::size_t safetensors_dtype_bytes(std::string_view dtype_name);
// "F32" etc.
std::string_view safetensors_dtype_name(DType dtype);
std::string format_shape(std::span<const std::int64_t> shape);

// Validates a header (the JSON text) for a file whose data buffer has data_bytes bytes. `where`
// names the file in messages. Entries come back sorted by data offset.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
};
SafetensorsHeader parse_safetensors_header(std::string_view json_text, std::uint64_t data_bytes,
                                           const std::string& where);

class SafetensorsFile {
 public:
  // Opens and validates `path`; throws IoError (cannot open/read) or FormatError (bad contents).
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile() = default;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const SafetensorsEntry* find(std::string_view name) const;

  // Reads the tensor into host memory `dst` as `to` elements (converting F32/BF16/F16 with
  // round-to-nearest-even). FormatError for a non-float tensor.
  void read(const SafetensorsEntry& entry, DType to, void* dst) const;
  // Reads rows [row_begin, row_end) of the tensor's first dimension (every other dimension whole),
  // as read() does; FormatError when the tensor has no such rows.
  void read_rows(const SafetensorsEntry& entry, DType to, std::int64_t row_begin, std::int64_t row_end,
                 void* dst) const;

 private:
  SafetensorsFile() = default;
  void read_elems(const SafetensorsEntry& entry, DType to, std::uint64_t first, std::uint64_t n, void* dst) const;
  std::string path_;
  UniqueFd fd_;
  std::uint64_t data_offset_ = 0;  // file offset of the data buffer
  SafetensorsHeader header_;
};

struct SafetensorsTensorOut {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;  // host memory, shape x dtype bytes
};

// Writes `tensors` (in the given order) to `path` via a temporary file, fsync and rename.
void write_safetensors(const std::string& path, std::span<const SafetensorsTensorOut> tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace strata::models
