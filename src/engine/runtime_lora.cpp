#include "engine/runtime_lora.h"

#include <span>
#include <utility>

#include "model/forward.h"
#include "model/lora.h"

namespace wick {

void add_serving_adapter(const LoadedModel& m, const std::string& name, const std::string& path,
                         int32_t adapter) {
  const std::pair<std::string, float> one{path, 1.f};
  add_named_lora(*m.model, name, std::span(&one, 1), adapter);
  try {
    prepare_adapter(*m.model, *m.device, adapter);
  } catch (...) {
    drop_adapter(*m.device, adapter);
    remove_named_lora(*m.model, adapter);
    throw;
  }
  m.count_adapter(adapter, path_bytes(path));
}

void remove_serving_adapter(const LoadedModel& m, int32_t adapter) {
  drop_adapter(*m.device, adapter);  // the backend's copies read the host terms: they go first
  remove_named_lora(*m.model, adapter);
  m.uncount_adapter(adapter);
}

}  // namespace wick
