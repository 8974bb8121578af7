// GGUF files from strangers: the header, metadata and tensor infos, then what
// wick reads from them (the model config, the tokenizer). A malformed file
// must be an IoError/ModelError/TextError, and every tensor it yields must
// lie inside the file.
#include "check_tensors.h"
#include "fuzz_input.h"
#include "io/error.h"
#include "io/gguf.h"
#include "model/config.h"

using namespace wick;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile mem;
  std::unique_ptr<GgufFile> f;
  try {
    f = std::make_unique<GgufFile>(mem.write(data, size));
  } catch (const IoError&) {
    return 0;
  }
  fuzz::check_tensors(f->tensors());
  try {
    ModelConfig c = config_from_gguf(*f);
    (void)c;
  } catch (const IoError&) {
  } catch (const ModelError&) {
  }
  try {
    auto tk = Tokenizer::from_gguf(*f);
    std::vector<int32_t> ids = tk->encode("Hello, wörld! <s> 123 \xe2\x96\x81 \n\t");
    for (int32_t id : ids)
      if (id < 0 || id >= tk->n_vocab()) std::abort();
    (void)tk->decode(ids, false);
  } catch (const IoError&) {
  } catch (const TextError&) {
  }
  return 0;
}
