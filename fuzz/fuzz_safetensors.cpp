// A .safetensors file from a stranger: the 8-byte length, the JSON header and
// the byte ranges it claims. Malformed files must be an IoError, and every
// tensor read must match its dtype x shape and lie inside the file.
#include "check_tensors.h"
#include "fuzz_input.h"
#include "io/error.h"

using namespace wick;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile mem;
  TensorSet ts;
  try {
    read_safetensors(mem.write(data, size), ts);
  } catch (const IoError&) {
    return 0;
  }
  fuzz::check_tensors(ts);
  return 0;
}
