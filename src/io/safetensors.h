// safetensors reader: single files and sharded folders, memory-mapped.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "io/tensor.h"

namespace wick {

// Tensors of one or more memory-mapped files, looked up by name.
class TensorSet {
 public:
  const TensorView* find(const std::string& name) const;
  const std::map<std::string, TensorView>& all() const { return tensors_; }
  void add(TensorView t);  // throws IoError on a duplicate name
  void keep(std::shared_ptr<MappedFile> f) { files_.push_back(std::move(f)); }
  // Whether a file the views point into has shrunk since it was mapped.
  bool files_shrunk() const {
    for (auto& f : files_)
      if (f->shrunk()) return true;
    return false;
  }

 private:
  std::map<std::string, TensorView> tensors_;
  std::vector<std::shared_ptr<MappedFile>> files_;
};

// Reads one .safetensors file into `out`. Validates the header: its size,
// dtypes, that byte ranges lie inside the file, do not overlap, and match
// dtype x shape.
void read_safetensors(const std::string& path, TensorSet& out);

// Reads a HF folder's weights: model.safetensors, or the shards listed in
// model.safetensors.index.json.
TensorSet read_safetensors_dir(const std::string& dir);

}  // namespace wick
