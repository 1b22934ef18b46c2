// Where a decoder's weights are read from: one safetensors file, or a Hugging Face model folder
// (models/hf_config.h: model.safetensors, or the shards model.safetensors.index.json names), with
// Strata's or Hugging Face's tensor names (detected), mapped onto the whole tensors of a
// ModelConfig. Opening checks everything before a value is read: every tensor the model needs is
// there once with its shape, nothing else is (HF's non-parameter buffers aside), an index names
// only tensors its shards hold. Values are then read tensor by tensor, or rows of one, so a model
// larger than host memory loads holding one tensor at a time (the ZeRO engine's init callback
// reads each shard's rows into its home as it goes).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "models/model_config.h"
#include "models/safetensors.h"

namespace strata::models {

enum class WeightNaming { Strata, HuggingFace };

class WeightSource {
 public:
  // `path`: a safetensors file or a Hugging Face model folder. `what` names the setting in
  // messages ("strata.init_weights", "--weights"). FormatError / IoError naming the file, the
  // tensor and the fix.
  static WeightSource open(const std::string& path, const ModelConfig& config, std::string what);

  WeightNaming naming() const { return naming_; }
  const std::string& path() const { return path_; }
  const std::vector<std::string>& files() const { return file_paths_; }

  // Rows [row_begin, row_end) of the model's whole tensor `strata_name` (its Strata shape, [out, in]
  // for a linear weight: GPT-2's Conv1D tensors are transposed on the way), converted to `to`.
  // FormatError naming the file, the tensor and the element when a value is NaN or infinite.
  void read_rows(const std::string& strata_name, DType to, std::int64_t row_begin, std::int64_t row_end,
                 void* dst) const;
  // The whole tensor.
  void read(const std::string& strata_name, DType to, void* dst) const;
  // Host bytes a read of a whole tensor into fp32 holds beside its destination (the file's
  // values before conversion, a Conv1D tensor before its transpose): the largest tensor's.
  std::uint64_t read_staging_bytes() const;
  std::uint64_t file_bytes() const;  // of the tensors the model reads

 private:
  struct Tensor {
    std::size_t file = 0;
    std::string file_name;  // the name in the file
    std::vector<std::int64_t> shape;  // Strata's
    bool transposed = false;
    std::uint64_t elems = 0;
    DType file_dtype = DType::F32;
  };
  std::string path_, what_;
  WeightNaming naming_ = WeightNaming::Strata;
  std::vector<std::string> file_paths_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Tensor> tensors_;  // by Strata name
};

}  // namespace strata::models
