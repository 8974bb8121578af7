// The streaming detokenizer with any id sequence: the input is little-endian
// uint16 ids (taken modulo the vocabulary; Qwen3 also sees its added tokens
// past 65535 through the high bit). What push() and finish() return, joined,
// must equal decode() of all the ids (unless byte tokens make invalid UTF-8:
// see below), and each piece must be valid UTF-8.
#include "fuzz_input.h"
#include "text/detokenizer.h"
#include "text/utf8.h"

using namespace wick;

namespace {

void run(const Tokenizer& tk, const std::vector<int32_t>& ids, bool skip_special) {
  StreamDecoder sd(tk, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = sd.push(id);
    if (utf8::find_invalid(piece) != std::string::npos) std::abort();
    streamed += piece;
  }
  streamed += sd.finish();
  // Where byte tokens form invalid UTF-8 the stream may already have sent a
  // valid prefix of the run that decode() replaces as a whole (as HF's
  // ByteFallback does); elsewhere the two agree exactly.
  const std::string all = tk.decode(ids, skip_special);
  if (all.find("\xef\xbf\xbd") == std::string::npos && streamed != all) {
    std::fprintf(stderr, "streamed text differs from decode():\n[%s]\n[%s]\nids:", streamed.c_str(),
                 all.c_str());
    for (int32_t id : ids) std::fprintf(stderr, " %d", id);
    std::fprintf(stderr, "\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)fuzz::shared_tokenizer("llama2");
  (void)fuzz::shared_tokenizer("qwen3");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer& llama2 = fuzz::shared_tokenizer("llama2");
  static const Tokenizer& qwen3 = fuzz::shared_tokenizer("qwen3");
  if (size < 1) return 0;
  const bool skip_special = data[0] & 1;
  std::vector<int32_t> ids;
  for (size_t i = 1; i + 1 < size; i += 2) ids.push_back(int32_t(data[i] | data[i + 1] << 8));
  const Tokenizer* tks[] = {&llama2, &qwen3};
  for (const Tokenizer* tk : tks) {
    std::vector<int32_t> in_vocab;
    for (int32_t id : ids) in_vocab.push_back(id % tk->n_vocab());
    if (tk == &qwen3)
      for (size_t k = 0; k < in_vocab.size(); ++k)
        if (ids[k] & 0x8000) in_vocab[k] = 151643 + ids[k] % (tk->n_vocab() - 151643);
    run(*tk, in_vocab, skip_special);
  }
  return 0;
}
