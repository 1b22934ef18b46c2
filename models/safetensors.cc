// safetensors read/write with full validation (see models/safetensors.h).
#include "models/safetensors.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "config/json_input.h"

namespace strata::models {

namespace {

// The header is JSON text: anything this large is corruption, not a model (the Rust reference
// implementation uses the same 100 MB limit).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct KnownDtype {
  const char* name;
  std::size_t bytes;
};
constexpr KnownDtype kKnownDtypes[] = {{"F64", 8}, {"F32", 4},  {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                       {"I32", 4}, {"I16", 2},  {"I8", 1},  {"U64", 8},  {"U32", 4},
                                       {"U16", 2}, {"U8", 1},   {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw FormatError(fmt::format("safetensors file '{}': {}", where, what));
}

}  // namespace

std::uint64_t SafetensorsEntry::elems() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::size_t safetensors_dtype_bytes(std::string_view dtype_name) {
  for (const auto& k : kKnownDtypes) {
    if (dtype_name == k.name) return k.bytes;
  }
  return 0;
}

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
  }
  return "?";
}

std::string format_shape(std::span<const std::int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

namespace {

// One tensor's entry of the header, checked on its own: known fields and dtype, a sane shape, and
// data_offsets that match the shape and lie inside the data buffer.
SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& value, std::uint64_t data_bytes,
                             const std::string& where) {
  const std::string t = fmt::format("tensor '{}'", name);
  if (!value.is_object()) bad(where, t + " is not a JSON object");
  for (const auto& [k, v] : value.items()) {
    (void)v;
    if (k != "dtype" && k != "shape" && k != "data_offsets") bad(where, fmt::format("{} has unknown field '{}'", t, k));
  }
  SafetensorsEntry e;
  e.name = name;
  if (!value.contains("dtype") || !value["dtype"].is_string()) bad(where, t + " has no string 'dtype'");
  e.dtype_name = value["dtype"].get<std::string>();
  const std::size_t esize = safetensors_dtype_bytes(e.dtype_name);
  if (esize == 0) bad(where, fmt::format("{} has unknown dtype '{}'", t, e.dtype_name));
  if (e.dtype_name == "F32") e.dtype = DType::F32;
  if (e.dtype_name == "BF16") e.dtype = DType::BF16;
  if (e.dtype_name == "F16") e.dtype = DType::F16;
  if (!value.contains("shape") || !value["shape"].is_array()) bad(where, t + " has no array 'shape'");
  std::uint64_t elems = 1;
  for (const auto& d : value["shape"]) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 0) bad(where, t + " has a shape entry that is not a non-negative integer");
    const auto dim = d.get<std::int64_t>();
    if (dim != 0 && elems > (std::uint64_t{1} << 62) / static_cast<std::uint64_t>(dim)) bad(where, t + " has an absurdly large shape");
    elems *= static_cast<std::uint64_t>(dim);
    e.shape.push_back(dim);
  }
  if (elems > std::uint64_t{1} << 60) bad(where, t + " has an absurdly large shape");  // elems x 8 must not wrap
  const auto& off = value.contains("data_offsets") ? value["data_offsets"] : nlohmann::json();
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    bad(where, t + " needs 'data_offsets' as two non-negative integers [begin, end]");
  }
  e.data_begin = off[0].get<std::uint64_t>();
  e.data_end = off[1].get<std::uint64_t>();
  if (e.data_end < e.data_begin) bad(where, fmt::format("{} has data_offsets [{}, {}] with end before begin", t, e.data_begin, e.data_end));
  if (e.bytes() != elems * esize) {
    bad(where, fmt::format("{} of shape {} and dtype {} needs {} bytes but its data_offsets span {}", t,
                           format_shape(e.shape), e.dtype_name, elems * esize, e.bytes()));
  }
  if (e.data_end > data_bytes) {
    bad(where, fmt::format("{} has data_offsets [{}, {}] past the end of the data buffer ({} bytes); the file is "
                           "truncated or corrupt",
                           t, e.data_begin, e.data_end, data_bytes));
  }
  return e;
}

// The tensors sorted by offset, checked to tile the data buffer exactly: no overlap, no hole, no
// trailing bytes.
void sort_and_check_coverage(std::vector<SafetensorsEntry>& tensors, std::uint64_t data_bytes, const std::string& where) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  std::uint64_t expected = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& e = tensors[i];
    if (e.data_begin < expected) {
      bad(where, fmt::format("tensor '{}' (bytes [{}, {})) overlaps tensor '{}' (bytes [{}, {}))", e.name, e.data_begin,
                             e.data_end, tensors[i - 1].name, tensors[i - 1].data_begin, tensors[i - 1].data_end));
    }
    if (e.data_begin > expected) {
      bad(where, fmt::format("the data buffer has a hole of {} bytes before tensor '{}' (the format forbids holes)",
                             e.data_begin - expected, e.name));
    }
    expected = e.data_end;
  }
  if (expected != data_bytes) {
    bad(where, fmt::format("the tensors cover {} bytes but the data buffer has {} (trailing garbage or a wrong header)",
                           expected, data_bytes));
  }
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::string_view json_text, std::uint64_t data_bytes,
                                           const std::string& where) {
  JsonInputError error;
  std::optional<nlohmann::json> parsed = parse_json_input(json_text, JsonComments::Refuse, &error);
  if (!parsed) {
    bad(where, fmt::format("the header is not well-formed JSON ({}); the file is corrupt or not safetensors",
                           error.message));
  }
  const nlohmann::json& j = *parsed;
  if (!j.is_object()) bad(where, "the header is not a JSON object; the file is corrupt or not safetensors");
  SafetensorsHeader out;
  for (const auto& [name, value] : j.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) bad(where, "__metadata__ must be an object of strings");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) bad(where, fmt::format("__metadata__ entry '{}' is not a string", k));
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    out.tensors.push_back(parse_entry(name, value, data_bytes, where));
  }
  sort_and_check_coverage(out.tensors, data_bytes, where);
  return out;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  UniqueFd fd = open_for_read(path, "safetensors file");
  const std::uint64_t size = file_size_bytes(fd.get(), path);
  if (size < 8) bad(path, fmt::format("the file has {} bytes, fewer than the 8-byte header length; it is truncated", size));
  unsigned char len_bytes[8];
  read_exact(fd.get(), len_bytes, 8, 0, path);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes) {
    bad(path, fmt::format("the header length is {} bytes (limit {}); the file is corrupt or not safetensors", header_len,
                          kMaxHeaderBytes));
  }
  if (8 + header_len > size) {
    bad(path, fmt::format("the header claims {} bytes but the file has only {} after the length; it is truncated",
                          header_len, size - 8));
  }
  std::string text(header_len, '\0');
  read_exact(fd.get(), text.data(), header_len, 8, path);
  SafetensorsFile f;
  f.header_ = parse_safetensors_header(text, size - 8 - header_len, path);
  f.path_ = path;
  f.data_offset_ = 8 + header_len;
  f.fd_ = std::move(fd);
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : header_.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void SafetensorsFile::read(const SafetensorsEntry& entry, DType to, void* dst) const {
  read_elems(entry, to, 0, entry.elems(), dst);
}

void SafetensorsFile::read_rows(const SafetensorsEntry& entry, DType to, std::int64_t row_begin, std::int64_t row_end,
                                void* dst) const {
  if (entry.shape.empty() || row_begin < 0 || row_begin > row_end || row_end > entry.shape[0]) {
    bad(path_, fmt::format("tensor '{}' of shape {} has no rows {}..{}", entry.name, format_shape(entry.shape),
                           row_begin, row_end));
  }
  std::uint64_t row_elems = 1;
  for (std::size_t d = 1; d < entry.shape.size(); ++d) row_elems *= static_cast<std::uint64_t>(entry.shape[d]);
  read_elems(entry, to, static_cast<std::uint64_t>(row_begin) * row_elems,
             static_cast<std::uint64_t>(row_end - row_begin) * row_elems, dst);
}

void SafetensorsFile::read_elems(const SafetensorsEntry& entry, DType to, std::uint64_t first, std::uint64_t n,
                                 void* dst) const {
  if (!entry.dtype) {
    bad(path_, fmt::format("tensor '{}' has dtype {}; Strata loads only F32, BF16 and F16 weights", entry.name,
                           entry.dtype_name));
  }
  const DType from = *entry.dtype;
  const std::size_t from_bytes = dtype_bytes(from);
  const std::uint64_t file_offset = data_offset_ + entry.data_begin + first * from_bytes;
  if (from == to) {
    read_exact(fd_.get(), dst, n * from_bytes, file_offset, path_);
    return;
  }
  std::vector<std::uint8_t> raw(n * from_bytes);
  read_exact(fd_.get(), raw.data(), raw.size(), file_offset, path_);
  for (std::uint64_t i = 0; i < n; ++i) {
    float v = 0;
    if (from == DType::F32) {
      std::memcpy(&v, raw.data() + 4 * i, 4);
    } else {
      std::uint16_t bits;
      std::memcpy(&bits, raw.data() + 2 * i, 2);
      v = from == DType::BF16 ? bf16_to_f32(bf16{bits}) : f16_to_f32(fp16{bits});
    }
    switch (to) {
      case DType::F32: std::memcpy(static_cast<char*>(dst) + 4 * i, &v, 4); break;
      case DType::BF16: { const bf16 h = f32_to_bf16(v); std::memcpy(static_cast<char*>(dst) + 2 * i, &h, 2); break; }
      case DType::F16: { const fp16 h = f32_to_f16(v); std::memcpy(static_cast<char*>(dst) + 2 * i, &h, 2); break; }
    }
  }
}

void write_safetensors(const std::string& path, std::span<const SafetensorsTensorOut> tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    std::uint64_t elems = 1;
    for (auto d : t.shape) {
      STRATA_CHECK(d >= 0, "negative dimension in tensor {}", t.name);
      elems *= static_cast<std::uint64_t>(d);
    }
    const std::uint64_t bytes = elems * dtype_bytes(t.dtype);
    STRATA_CHECK(!header.contains(t.name), "duplicate tensor name '{}' in safetensors write", t.name);
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data buffer 8-byte aligned
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  AtomicFileWriter out(path);
  out.append(len_bytes, 8);
  out.append(text.data(), text.size());
  for (const auto& t : tensors) {
    std::uint64_t elems = 1;
    for (auto d : t.shape) elems *= static_cast<std::uint64_t>(d);
    out.append(t.data, elems * dtype_bytes(t.dtype));
  }
  out.commit();
}

}  // namespace strata::models
