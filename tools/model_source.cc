// --model and --weights of eval and generate (tools/model_source.h).
#include "tools/model_source.h"

#include <fmt/format.h>

#include "core/error.h"
#include "models/hf_config.h"

namespace strata::tools {

ModelSource resolve_model_source(const std::string& model, const std::string& weights, const std::string& command) {
  ModelSource out;
  if (models::is_hf_model_folder(model)) {
    models::HfModelFolder folder = models::open_hf_model_folder(model);
    out.config = folder.config;
    out.notes = folder.notes;
    out.folder = model;
  } else {
    out.config = models::model_config_by_name(model);
  }
  out.weights = weights;
  if (out.weights.empty()) {
    if (out.folder.empty()) {
      throw ConfigError(
          fmt::format("{}: --weights is required with --model '{}' (a name, not a model folder)", command, model));
    }
    out.weights = out.folder;
  }
  return out;
}

}  // namespace strata::tools
